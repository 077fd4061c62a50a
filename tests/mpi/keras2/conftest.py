"""The Keras 2 suite runs where tf.keras is tf_keras: with TF_USE_LEGACY_KERAS=1 and tf-keras
installed, as tests/test_mpi_suites.py runs it. Anywhere else it stops at collection, saying so."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

if not tf.keras.Model.__module__.startswith("tf_keras."):
    raise RuntimeError(f"tests/mpi/keras2 needs tf.keras to be tf_keras (TF_USE_LEGACY_KERAS=1 with tf-keras "
                       f"installed); here it is {tf.keras.Model.__module__}")
