"""`import hvdplus.torch as hvd`: Horovod's PyTorch API on hvdplus.

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""

from ..core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from ..core.basics import __all__ as _BASICS
from . import elastic
from .compression import Compression
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import (
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
    alltoall_async, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
    grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, join, poll, reducescatter,
    reducescatter_async, sparse_allreduce_async, synchronize,
)
from .optimizer import DistributedOptimizer
from .p2p import recv, recv_async, send, send_async
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    *_BASICS,
    "elastic", "Compression", "allgather_object", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "poll", "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
    "DistributedOptimizer", "recv", "recv_async", "send", "send_async", "SyncBatchNorm",
]
