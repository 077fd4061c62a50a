"""Keras' TensorFlow trainer applies gradients inside `tf.function`: hvdplus.tensorflow's
grouped all-reduce bridges graph tensors to the engine."""

import tensorflow as tf

from ... import tensorflow as hvd_tf


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None):
    # In a graph the trace names it (unique in the train function, alike on every rank), so
    # that two optimizers in one step (a GAN's) never share a name while both run.
    return hvd_tf.grouped_allreduce(tensors, op=op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, name=name if tf.executing_eagerly() else None,
                                    process_set=process_set)
