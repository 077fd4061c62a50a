"""One spec per collective kind (see spec.py): each module here declares its kinds' specs.

Importing this package imports every module in it, so a new kind is one new module here
plus its entries in the numpy API (hvdplus.core.collectives) and the adapters' mpi_ops."""

import importlib
import pkgutil

from .spec import JOINED, KindSpec, declare, spec_of, zeros_to_reduce

__all__ = ["JOINED", "KindSpec", "declare", "spec_of", "zeros_to_reduce"]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
