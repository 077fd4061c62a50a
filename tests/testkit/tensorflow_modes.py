"""The two ways the in-rank TensorFlow suites (tests/mpi/test_tf_*.py) run each check: eagerly,
and traced into a tf.function."""

import tensorflow as tf

MODES = ["eager", "graph"]


def run(mode, fn, *args):
    """fn(*args) eagerly, or traced into a tf.function and run."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def gradient_of(mode, loss_fn, *variables):
    """d loss_fn() / d variables, eagerly or inside a tf.function."""

    def compute():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        return tape.gradient(loss, list(variables))

    return run(mode, compute)
