"""SyncBatchNormalization: Keras batch normalization whose batch statistics cover every
rank's rows, as Horovod's does.

In training, each call all-reduces (Sum) one vector per layer: the per-channel sums and
sums of squares of this rank's rows, and their count; the mean and variance of the global
batch follow, so local batch sizes may differ. The all-reduce is differentiable (its
gradient is the Sum all-reduce of the upstream gradients), so backward propagation sees the
global statistics too. Every rank must call the layer the same number of times, in the same
order. A call with a mask uses this rank's rows alone.

The layer is the BatchNormalization of the Keras that tf.keras is when this module is first
imported: Keras 3, or tf_keras (Keras 2) under `TF_USE_LEGACY_KERAS=1`. The two ask a
different method for their batch statistics, so each has its hook class below.
"""

import tensorflow as tf

from ..common.reduce_ops import Sum
from ..core.process_sets import global_process_set
from .mpi_ops import allreduce

__all__ = ["SyncBatchNormalization"]


class _GlobalBatchStatistics:
    """The mean and variance over every rank's rows, for the hook of each Keras below."""

    def _global_moments(self, inputs, axes, keep_dims=False):
        dtype = tf.float32 if inputs.dtype in (tf.float16, tf.bfloat16) else inputs.dtype
        values = tf.cast(inputs, dtype)
        sums = tf.reduce_sum(values, axes, keepdims=True)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(values), axes)), dtype)
        local = tf.concat([tf.reshape(sums, [-1]), tf.reshape(tf.reduce_sum(tf.square(values), axes), [-1]),
                           tf.reshape(count, [1])], axis=0)
        total = allreduce(local, op=Sum, process_set=self.process_set)
        channels = tf.size(sums)
        rows = tf.maximum(total[-1], 1.0)
        mean = total[:channels] / rows
        variance = tf.maximum(total[channels:2 * channels] / rows - tf.square(mean), 0.0)
        # The statistics' shape: the input's with its reduced axes kept as 1, or left out.
        kept = [axis for axis in range(inputs.shape.rank) if axis not in axes]
        shape = tf.shape(sums) if keep_dims else tf.gather(tf.shape(values), kept)
        return tf.cast(tf.reshape(mean, shape), inputs.dtype), tf.cast(tf.reshape(variance, shape), inputs.dtype)


class _Keras3Hook(_GlobalBatchStatistics):
    """Keras 3 asks `_moments(inputs, mask)`, and has no fused kernel."""

    def _moments(self, inputs, mask):
        if mask is not None:
            return super()._moments(inputs, mask)
        return self._global_moments(inputs, list(self._reduction_axes))


class _Keras2Hook(_GlobalBatchStatistics):
    """tf_keras asks `_calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask)`, unless
    it runs its fused kernel, which 4-D inputs get by default and which it is kept from here."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, fused=False, **kwargs)

    def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
        if mask is not None:
            return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask)
        return self._global_moments(inputs, list(reduction_axes), keep_dims)


_KERAS_2 = tf.keras.layers.BatchNormalization.__module__.startswith("tf_keras.")


class SyncBatchNormalization(_Keras2Hook if _KERAS_2 else _Keras3Hook, tf.keras.layers.BatchNormalization):
    """tf.keras.layers.BatchNormalization with its batch statistics over every rank of
    `process_set` (the whole job by default); its other arguments are Keras', and `fused`
    Horovod's (False, the only value it takes)."""

    def __init__(self, *args, fused=False, process_set=global_process_set, **kwargs):
        # Horovod's signature: the statistics are all-reduced in the hook, which a fused
        # kernel would bypass.
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True: its statistics are all-reduced")
        super().__init__(*args, **kwargs)
        self.process_set = process_set
