"""Collectives on Keras backend tensors, eager, through numpy; and the gradient all-reduce
that each backend runs inside its own training step.

Each takes `process_set=` (the whole job by default): the collective runs over that set's
ranks; ranks (broadcast roots) are job ranks; a rank outside the set gets a ValueError."""

import keras
import numpy as np

from ..common.reduce_ops import Average, reduce_op_from
from ..core import collectives
from ..core.process_sets import global_process_set
from . import backends
from .compression import Compression

# The gradient group's name: one name for every step and every model. Keras makes up variable
# paths from per-process counters ("dense_3/kernel"), which differ between ranks when one rank
# has built other layers first (an evaluation model, a probe on rank 0 only), so a name built
# from them would stall the job; one built from the shapes would turn models that differ
# between ranks into a stall rather than an error that names the shapes. The same name in
# every step is also what the engine's response cache keeps. (In a TensorFlow graph each
# trace names its collectives itself: see backends/tensorflow.py.)
GRADIENTS_GROUP = "keras.gradients"

__all__ = ["allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object", "allgather_object",
           "allreduce_gradients"]


def _to_numpy(value):
    return np.array(keras.ops.convert_to_numpy(value), order="C")  # keeps 0-d shapes


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set, weight=None):
    """All-reduce a backend tensor (eager), Average unless `op` (or the deprecated
    `average`) says otherwise; returns a backend tensor. Horovod's argument order.

    `weight` (op Average only; this rank's sample count, say) makes it the weighted average
    sum_i(w_i x_i) / sum_i(w_i), as hvdplus.allreduce's."""
    wire, ctx = compression.compress(keras.ops.convert_to_tensor(value))
    if weight is not None and not isinstance(weight, (int, float)):
        weight = _to_numpy(weight)
    result = collectives.allreduce(_to_numpy(wire), reduce_op_from(average, op), prescale_factor,
                                   postscale_factor, name=name, process_set=process_set, weight=weight)
    return compression.decompress(keras.ops.convert_to_tensor(result), ctx)


def allgather(value, name=None, process_set=global_process_set):
    """Every rank's `value` concatenated along the first axis."""
    return keras.ops.convert_to_tensor(collectives.allgather(_to_numpy(value), name=name, process_set=process_set))


def broadcast(value, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s `value` on every rank (`root_rank` is a job rank, in `process_set`)."""
    return keras.ops.convert_to_tensor(collectives.broadcast(_to_numpy(value), root_rank, name=name,
                                                             process_set=process_set))


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """`value` reduced over ranks, of which rank r keeps block r of the rows."""
    return keras.ops.convert_to_tensor(collectives.reducescatter(_to_numpy(value), op, name=name,
                                                                 process_set=process_set))


def broadcast_object(obj=None, root_rank=0, name=None, process_set=global_process_set):
    return collectives.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    return collectives.allgather_object(obj, name, process_set)


def allreduce_gradients(grads, variables, op=Average, prescale_factor=1.0, postscale_factor=1.0, process_set=None,
                        weight=None):
    """All-reduce a training step's gradients as one fused group, on whatever the backend
    hands the optimizer: TensorFlow tensors inside `tf.function`, torch tensors eagerly,
    JAX tracers inside `jax.jit` (one module each in `backends`), over `process_set`'s
    ranks (None: the job's). `None` gradients stay None (every rank's model has the same
    unused variables). `weight`, a backends.step_weight.StepWeight, weighs the average by
    the count it reads when the step runs."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    group = GRADIENTS_GROUP
    reduced = backends.for_backend(keras.backend.backend()).grouped_allreduce(
        [grads[i] for i in present], [variables[i] for i in present], op, prescale_factor, postscale_factor, group,
        process_set, weight)
    result = list(grads)
    for index, tensor in zip(present, reduced):
        result[index] = tensor
    return result
