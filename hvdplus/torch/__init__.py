"""`import hvdplus.torch as hvd`: Horovod's PyTorch API on hvdplus.

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""

from ..core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from ..core.basics import __all__ as _BASICS
from ..core.communication_stats import communication_stats, reset_communication_stats
from ..core.join import Join
from ..core.load_balance import LoadBalancer
from . import elastic
from .balanced_sampler import BalancedSampler
from .compression import Compression
from .diloco import DiLoCo
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import *  # noqa: F401,F403 (the collectives, as mpi_ops.__all__ lists them)
from .model_averaging import LocalSGD, PeriodicModelAverager
from .mpi_ops import __all__ as _MPI_OPS
from .optimizer import DistributedOptimizer
from .p2p import recv, recv_async, send, send_async
from .sync_batch_norm import SyncBatchNorm
from .zero import ZeroRedundancyOptimizer

__all__ = [
    *_BASICS, *_MPI_OPS,
    "elastic", "LoadBalancer", "BalancedSampler",
    "Join", "Compression", "allgather_object", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "DistributedOptimizer", "recv", "recv_async", "send", "send_async", "SyncBatchNorm",
    "PeriodicModelAverager", "LocalSGD", "DiLoCo", "ZeroRedundancyOptimizer", "communication_stats",
    "reset_communication_stats",
]
