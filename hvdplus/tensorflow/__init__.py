"""`import hvdplus.tensorflow as hvd`: Horovod's TensorFlow API on hvdplus, eagerly, in tf.function and
in tf.compat.v1 graphs run by a Session.

    hvd.init()
    tape = hvd.DistributedGradientTape(tape)          # averaged gradients
    hvd.broadcast_variables(model.variables, root_rank=0)
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=hvd.CrossDeviceOps())
"""

from ..core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from ..core.basics import __all__ as _BASICS
from ..core.load_balance import LoadBalancer
from . import elastic
from .compression import Compression
from .cross_device_ops import CrossDeviceOps
from .functions import (
    BroadcastGlobalVariablesHook, allgather_object, broadcast_, broadcast_global_variables, broadcast_object,
    broadcast_variables,
)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .graph_queries import local_rank_op, local_size_op, process_set_included_op, rank_op, size_op
from .mpi_ops import *  # noqa: F401,F403 (the collectives, as mpi_ops.__all__ lists them)
from .mpi_ops import __all__ as _MPI_OPS
from .optimizer import DistributedOptimizer
from .p2p import recv, send
from .sync_batch_norm import SyncBatchNormalization

__all__ = [
    *_BASICS, *_MPI_OPS,
    "elastic", "LoadBalancer",
    "Compression", "CrossDeviceOps", "BroadcastGlobalVariablesHook", "allgather_object", "broadcast_",
    "broadcast_global_variables", "broadcast_object", "broadcast_variables", "DistributedGradientTape",
    "PartialDistributedGradientTape", "local_rank_op", "local_size_op", "process_set_included_op", "rank_op",
    "size_op", "DistributedOptimizer", "recv", "send", "SyncBatchNormalization",
]
