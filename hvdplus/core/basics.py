"""The names every hvdplus API offers alike: `hvdplus`, `hvdplus.torch`, `hvdplus.tensorflow`
and `hvdplus.keras` each star-import this module, so that `hvd.init()`, `hvd.rank()`,
`hvd.Sum` or `hvd.nccl_built()` mean the same whichever one a script imports as `hvd`.

Importing it starts nothing: MPI starts in `init()`.
"""

from ..common.build_queries import *  # noqa: F401,F403 (Horovod's build queries)
from ..common.build_queries import __all__ as _BUILD_QUERIES
from ..common.errors import (
    HorovodInternalError, HostsUpdatedInterrupt, HvdplusError, NotInitializedError, RanksFailedError, ShutdownError,
    StalledError, TensorMismatchError,
)
from ..common.reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .p2p import recv, recv_async, send, send_async
from .process_sets import ProcessSet, add_process_set, global_process_set, init, remove_process_set
from .runtime import (
    cross_rank, cross_size, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, rank, shutdown, size, start_timeline, stop_timeline,
)

__all__ = [
    "HvdplusError", "NotInitializedError", "TensorMismatchError", "ShutdownError", "StalledError",
    "RanksFailedError", "HorovodInternalError", "HostsUpdatedInterrupt",
    "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "start_timeline", "stop_timeline", "send", "recv", "send_async", "recv_async",
    *_BUILD_QUERIES,
]
