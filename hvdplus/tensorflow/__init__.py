"""`import hvdplus.tensorflow as hvd`: Horovod's TensorFlow 2 API on hvdplus, eager and in tf.function.

    hvd.init()
    tape = hvd.DistributedGradientTape(tape)          # averaged gradients
    hvd.broadcast_variables(model.variables, root_rank=0)
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=hvd.CrossDeviceOps())
"""

from ..engine.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from . import elastic
from .compression import Compression
from .cross_device_ops import CrossDeviceOps
from .functions import allgather_object, broadcast_object, broadcast_variables
from .gradient_tape import DistributedGradientTape
from .mpi_ops import (
    allgather, allreduce, alltoall, barrier, broadcast, grouped_allgather, grouped_allreduce, join,
    reducescatter,
)
from .optimizer import DistributedOptimizer
from .p2p import recv, send
