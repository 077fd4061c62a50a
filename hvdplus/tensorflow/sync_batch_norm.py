"""SyncBatchNormalization: Keras batch normalization whose batch statistics cover every
rank's rows, as Horovod's does.

In training, each call all-reduces (Sum) one vector per layer: the per-channel sums and
sums of squares of this rank's rows, and their count; the mean and variance of the global
batch follow, so local batch sizes may differ. The all-reduce is differentiable (its
gradient is the Sum all-reduce of the upstream gradients), so backward propagation sees the
global statistics too. Every rank must call the layer the same number of times, in the same
order. A call with a mask uses this rank's rows alone.
"""

import tensorflow as tf

from ..common.reduce_ops import Sum
from ..core.process_sets import global_process_set
from .mpi_ops import allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """tf.keras.layers.BatchNormalization with its batch statistics over every rank of
    `process_set` (the whole job by default); its other arguments are Keras', and `fused`
    Horovod's (False, the only value it takes)."""

    def __init__(self, *args, fused=False, process_set=global_process_set, **kwargs):
        # Horovod's signature: the statistics are all-reduced in `_moments`, which a fused
        # kernel would bypass; Keras 3 has no fused kernel to turn off.
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True: its statistics are all-reduced")
        super().__init__(*args, **kwargs)
        self.process_set = process_set

    def _moments(self, inputs, mask):
        if mask is not None:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        dtype = tf.float32 if inputs.dtype in (tf.float16, tf.bfloat16) else inputs.dtype
        values = tf.cast(inputs, dtype)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(values), axes)), dtype)
        local = tf.concat([tf.reduce_sum(values, axes), tf.reduce_sum(tf.square(values), axes),
                           tf.reshape(count, [1])], axis=0)
        total = allreduce(local, op=Sum, process_set=self.process_set)
        channels = (tf.shape(total)[0] - 1) // 2
        rows = tf.maximum(total[-1], 1.0)
        mean = total[:channels] / rows
        variance = tf.maximum(total[channels:2 * channels] / rows - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
