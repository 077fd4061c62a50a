"""hvdplus: Horovod-style data-parallel training over MPI for numpy, PyTorch, TensorFlow and Keras.

    import hvdplus as hvd
    hvd.init()
    mean = hvd.allreduce(local_gradient)          # averaged over hvd.size() ranks

Importing hvdplus starts nothing; `hvd.init()` starts MPI. The collectives here work on
numpy arrays; `hvdplus.torch`, `hvdplus.tensorflow` and `hvdplus.keras` wrap them for tensors.
`hvdplus.run(fn, np=4)` starts a job from Python and returns what `fn` returned on each rank.
"""

import importlib

from .core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from .core.basics import __all__ as _BASICS
from .version import __version__

# Loaded on first use, because importing them imports mpi4py.MPI, which initializes MPI:
# the launcher (`python -m hvdplus.runner`) must not do that.
_LAZY = {
    name: "hvdplus.core.collectives"
    for name in (
        "allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
        "barrier", "broadcast_object", "allgather_object", "grouped_allreduce", "join",
        "allreduce_async", "grouped_allreduce_async", "allgather_async", "broadcast_async",
        "alltoall_async", "reducescatter_async", "poll", "synchronize",
    )
}

# Starting a job from Python: the launcher's, which never initializes MPI in this process.
_LAZY.update({name: "hvdplus.runner.python_function" for name in ("run", "RanksRaisedError")})

__all__ = ["__version__", *_BASICS, *sorted(_LAZY)]


def __getattr__(name):
    if name == "elastic":  # a package of its own, loaded on first use like the collectives
        return importlib.import_module("hvdplus.elastic")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hvdplus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"elastic"})
