"""Keras' TensorFlow trainer applies gradients inside `tf.function`: hvdplus.tensorflow's
grouped all-reduce bridges graph tensors to the engine."""

from ... import tensorflow as hvd_tf


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None):
    return hvd_tf.grouped_allreduce(tensors, op=op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, name=name, process_set=process_set)
