"""hvdplus: Horovod-style data-parallel training over MPI for numpy, PyTorch, TensorFlow and Keras.

    import hvdplus as hvd
    hvd.init()
    mean = hvd.allreduce(local_gradient)          # averaged over hvd.size() ranks

Importing hvdplus starts nothing; `hvd.init()` starts MPI. The collectives here work on
numpy arrays; `hvdplus.torch`, `hvdplus.tensorflow` and `hvdplus.keras` wrap them for tensors.
`hvdplus.run(fn, np=4)` starts a job from Python and returns what `fn` returned on each rank.
"""

import importlib

from .core import mpi_environment
from .core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from .core.basics import __all__ as _BASICS
from .version import __version__  # noqa: F401 (the package's version; __all__ is built on first use)

# Before anything imports mpi4py.MPI, which starts MPI: the adapters do as they load.
mpi_environment.prepare()

# Loaded on first use, because importing them imports mpi4py.MPI, which initializes MPI:
# the launcher (`python -m hvdplus.runner`) must not do that. The collectives are those that
# hvdplus.core.collectives lists; the launcher's are below.
_COLLECTIVES = "hvdplus.core.collectives"
# Starting a job from Python: the launcher's, which never initializes MPI in this process.
_LAUNCHER = {name: "hvdplus.runner.python_function" for name in ("run", "RanksRaisedError")}
# Other core classes that stand on the collectives, loaded on first use for the same reason.
_CORE_CLASSES = {"LoadBalancer": "hvdplus.core.load_balance"}


def _collective_names():
    return importlib.import_module(_COLLECTIVES).__all__


def __getattr__(name):
    if name == "__all__":  # built on first use, from the collectives' own list
        return ["__version__", *_BASICS, *_collective_names(), *sorted(_CORE_CLASSES), *sorted(_LAUNCHER)]
    if name.startswith("__"):  # probes such as __wrapped__ must not load the collectives, nor start MPI
        raise AttributeError(f"module 'hvdplus' has no attribute {name!r}")
    if name == "elastic":  # a package of its own, loaded on first use like the collectives
        return importlib.import_module("hvdplus.elastic")
    module = _LAUNCHER.get(name) or _CORE_CLASSES.get(name)
    if module is None and name in _collective_names():
        module = _COLLECTIVES
    if module is None:
        raise AttributeError(f"module 'hvdplus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_collective_names()) | set(_CORE_CLASSES) | set(_LAUNCHER) | {"elastic"})
