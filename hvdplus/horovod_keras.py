"""Horovod's TensorFlow names that are Keras', resolved to hvdplus's Keras adapters: the module
path `hvdplus.tensorflow.keras` (Horovod's `horovod.tensorflow.keras`), with the
`TensorFlowKerasState` that `hvdplus.tensorflow.elastic` takes from it, and
`hvdplus.tensorflow.DistributedOptimizer` given a Keras optimizer.

`hvdplus.keras` sits above hvdplus.tensorflow (it serves TensorFlow as one of Keras' backends),
so the choice between it and `hvdplus.tensorflow.keras2` is made here, in the Horovod-compat
layer above every adapter. This module sits beside `hvdplus.horovod_alias` rather than in it:
that package's folder is on the import path of a Horovod job's ranks, where each module in it
would also load under its bare name. pyproject.toml's import-linter contracts name the two
modules of hvdplus.tensorflow that import this one, and keep every other module of that package
from reaching it.

Nothing is imported until asked for, so `import hvdplus.tensorflow` loads no Keras.
"""

import tensorflow as tf

__all__ = ["tf_keras_adapter", "wrap_keras_optimizer"]


def tf_keras_adapter():
    """The hvdplus module for the Keras that tf.keras is: `hvdplus.keras` for Keras 3
    (TensorFlow 2.16+), `hvdplus.tensorflow.keras2` for tf_keras (Keras 2, under
    `TF_USE_LEGACY_KERAS=1` with `tf-keras` installed). tf.keras' own module name may read
    `tensorflow.keras` whichever it is, so its Model class tells them apart."""
    if tf.keras.Model.__module__.startswith("tf_keras."):
        from .tensorflow import keras2

        return keras2
    from . import keras

    return keras


def wrap_keras_optimizer(optimizer, **options):
    """`hvdplus.keras.DistributedOptimizer(optimizer, **options)`: the Keras 3 adapter wraps
    a Keras 3 optimizer on every backend, whatever tf.keras is."""
    from .keras.optimizer import DistributedOptimizer

    return DistributedOptimizer(optimizer, **options)
