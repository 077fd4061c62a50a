"""Collectives on values and tensors, in the argument order of Horovod's
`horovod.tensorflow.keras`: hvdplus.tensorflow's collectives on the value as a tensor, whose
result comes back eagerly, or, in a tf.compat.v1 graph, as its value run in Keras' session.

Each takes `process_set=` (the whole job by default): the collective runs over that set's
ranks; ranks (broadcast roots) are job ranks; a rank outside the set gets a ValueError."""

import tensorflow as tf

from ...common.reduce_ops import Average
from ...core.process_sets import global_process_set
from .. import mpi_ops
from ..compression import Compression
from ..functions import allgather_object, broadcast_object

__all__ = ["allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object", "allgather_object",
           "evaluated"]


def evaluated(result):
    """`result` itself eagerly (or None); in a tf.compat.v1 graph, its value, run in Keras' session."""
    return result if result is None or tf.executing_eagerly() else tf.compat.v1.keras.backend.get_session().run(result)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set, weight=None):
    """`value` reduced over ranks, Average unless `op` (or the deprecated `average`) says
    otherwise: `postscale_factor * reduce(prescale_factor * value)`. `weight` (op Average
    only) makes it the weighted average sum_i(w_i x_i) / sum_i(w_i), as hvdplus.allreduce's."""
    return evaluated(mpi_ops.allreduce(tf.convert_to_tensor(value), average, compression, op, prescale_factor,
                                       postscale_factor, name, process_set, weight))


def allgather(value, name=None, process_set=global_process_set):
    """Every rank's `value` concatenated along the first axis."""
    return evaluated(mpi_ops.allgather(tf.convert_to_tensor(value), name, process_set))


def broadcast(value, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s `value` on every rank (`root_rank` is a job rank, in `process_set`)."""
    return evaluated(mpi_ops.broadcast(tf.convert_to_tensor(value), root_rank, name, process_set))


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """`value` reduced over ranks, of which rank r keeps block r of the rows."""
    return evaluated(mpi_ops.reducescatter(tf.convert_to_tensor(value), op=op, name=name, process_set=process_set))
