"""`import hvdplus.tensorflow as hvd`: Horovod's TensorFlow 2 API on hvdplus, eager and in tf.function.

    hvd.init()
    tape = hvd.DistributedGradientTape(tape)          # averaged gradients
    hvd.broadcast_variables(model.variables, root_rank=0)
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=hvd.CrossDeviceOps())
"""

from ..common.build_queries import *  # noqa: F401,F403 (Horovod's build queries)
from ..common.errors import (
    HvdplusError,
    NotInitializedError,
    ShutdownError,
    StalledError,
    TensorMismatchError,
)
from ..common.reduce_ops import Average, Max, Min, Product, ReduceOp, Sum
from ..engine.runtime import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .compression import Compression
from .cross_device_ops import CrossDeviceOps
from .functions import allgather_object, broadcast_object, broadcast_variables
from .gradient_tape import DistributedGradientTape
from .mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    join,
    reducescatter,
)
from .optimizer import DistributedOptimizer
