"""Keras' TensorFlow trainer applies gradients inside `tf.function`: hvdplus.tensorflow's
grouped all-reduce bridges graph tensors to the engine. A weighted step's all-reduce is one
host op of its own, which reads this rank's count when the step runs (step_weight.py)."""

import tensorflow as tf

from ... import tensorflow as hvd_tf
from ...common.scaling import Reduction
from ...tensorflow.buffers import run_on_host
from ...tensorflow.collective_names import collective_name
from .step_weight import reduce_on_host_async

__all__ = ["grouped_allreduce", "traced"]


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None,
                      weight=None):
    # In a graph the trace names it (unique in the train function, alike on every rank), so
    # that two optimizers in one step (a GAN's) never share a name while both run.
    name = name if tf.executing_eagerly() else None
    if weight is None:
        return hvd_tf.grouped_allreduce(tensors, op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, name=name, process_set=process_set)
    name = collective_name("grouped_allreduce", name, process_set)
    reduction = Reduction(op, prescale_factor, postscale_factor)
    # A weighted average of IndexedSlices (an embedding's) is taken of their dense form.
    dense = [tf.convert_to_tensor(t) for t in tensors]

    def reduce(*arrays):
        return reduce_on_host_async(list(arrays), name, reduction, process_set, weight).wait()

    return run_on_host(reduce, dense, [t.dtype for t in dense], [t.shape for t in dense])


def traced(tensors) -> bool:
    """Whether the step is being traced into a graph (tf.function), not run eagerly."""
    return not tf.executing_eagerly()
