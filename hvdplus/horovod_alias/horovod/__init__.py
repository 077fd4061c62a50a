"""Horovod's module names, served by hvdplus: `import horovod.torch as hvd` gives a module
holding everything of `hvdplus.torch`, and so on for `horovod.tensorflow`,
`horovod.tensorflow.keras`, `horovod.keras` and `horovod.common`, with their submodules
(`horovod.torch.elastic`, `horovod.keras.callbacks`...). See docs/moving-from-horovod.md.

This package is on the import path only where a launcher put it there for a job
(`horovodrun`, `hvdplusrun --horovod-compat`), and it refuses to load where a real Horovod
is importable too: an installed Horovod is never shadowed.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

from hvdplus.horovod_alias import PATH, real_horovod
from hvdplus.version import __version__ as _hvdplus_version

_real = real_horovod()
if _real is not None:
    raise ImportError(
        f"hvdplus's Horovod alias ({os.path.join(PATH, 'horovod')}) will not shadow the Horovod installed at "
        f"{_real}: take {PATH} off PYTHONPATH (or run without --horovod-compat) to use that Horovod, "
        "or uninstall it to run Horovod programs on hvdplus"
    )

# Horovod's last release, with hvdplus's version as its local part: version checks in
# Horovod programs ("at least 0.21") pass, and the text says what runs them.
__version__ = f"0.28.1+hvdplus.{_hvdplus_version}"

# Horovod's module -> the hvdplus module serving it; others map by name (horovod.X -> hvdplus.X):
# horovod.tensorflow.keras and its callbacks and elastic go through hvdplus.tensorflow.keras,
# which serves Keras 3 or tf_keras after what tf.keras is.
RENAMED = {
    "horovod.common.exceptions": "hvdplus.common.errors",
    "horovod.common.process_sets": "hvdplus.core.process_sets",
    "horovod.torch.mpi_ops": "hvdplus.torch",
    "horovod.torch.optimizer": "hvdplus.torch",
    "horovod.torch.functions": "hvdplus.torch",
    "horovod.torch.elastic.sampler": "hvdplus.torch.elastic",
    "horovod.torch.elastic.state": "hvdplus.torch.elastic",
    "horovod.tensorflow.mpi_ops": "hvdplus.tensorflow",
    "horovod.tensorflow.functions": "hvdplus.tensorflow",
    "horovod.tensorflow.util": "hvdplus.tensorflow",
    "horovod.keras.callbacks": "hvdplus.keras.callbacks",
    "horovod.keras.elastic": "hvdplus.keras.elastic",
}

# Horovod's module -> the hvdplus module whose PRIVATE_NAMES[module] it also holds: private names
# that programs copied from Horovod's tests call, kept off hvdplus's own modules.
PRIVATE = {name: "hvdplus.horovod_alias.tensorflow_private"
           for name in ("horovod.tensorflow", "horovod.tensorflow.mpi_ops", "horovod.tensorflow.util")}
# Horovod's package -> its submodules that are attributes of it (`hvd.mpi_ops`), as they are
# where the package imports them itself.
SUBMODULES = {"horovod.tensorflow": ("mpi_ops", "util")}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `horovod.<name>` and makes it a module of its own holding the hvdplus module's
    names (the same objects), so hvdplus's own modules are never renamed."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        name = module.__name__
        target_name = RENAMED.get(name, "hvdplus." + name[len("horovod."):])
        try:
            target = importlib.import_module(target_name)
        except ModuleNotFoundError as error:
            if error.name is not None and not target_name.startswith(error.name):
                raise  # a framework the hvdplus module needs is missing: say that
            raise ModuleNotFoundError(
                f"No module named '{name}': hvdplus serves Horovod's torch, tensorflow, tensorflow.keras, "
                f"keras, common, spark and ray modules, not this one (see docs/moving-from-horovod.md)",
                name=name) from None
        module.__dict__.update({key: value for key, value in vars(target).items()
                                if not (key.startswith("__") and key.endswith("__"))})
        module.__all__ = list(getattr(target, "__all__", [k for k in vars(target) if not k.startswith("_")]))
        module.__doc__ = target.__doc__
        module.__getattr__ = lambda attribute: getattr(target, attribute)
        module.__path__ = []  # a package, so that its submodules resolve through this finder
        if name in PRIVATE:
            module.__dict__.update(importlib.import_module(PRIVATE[name]).PRIVATE_NAMES[name])
        for submodule in SUBMODULES.get(name, ()):
            setattr(module, submodule, importlib.import_module(f"{name}.{submodule}"))


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


def __getattr__(name):
    # horovod.run: start a job from Python (hvdplus.run), for driver programs written against Horovod.
    if name == "run":
        import hvdplus
        return hvdplus.run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")
