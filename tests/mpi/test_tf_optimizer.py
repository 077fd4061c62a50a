"""hvdplus.tensorflow.DistributedOptimizer and Horovod's `hvdplus.tensorflow.keras` path: a
tf.keras optimizer's gradients are averaged over ranks, eagerly and inside tf.function; a
tf.compat.v1.train optimizer's in a Session (accumulated over passes too) and eagerly, against
one process. Any number of ranks."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
import hvdplus.keras  # noqa: E402
import hvdplus.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.keras is Keras on TensorFlow")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_keras_optimizer_applies_the_average_over_ranks(mode, rank, size):
    variable = keras.Variable(np.zeros(2, dtype="float32"))
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0))
    assert isinstance(optimizer, keras.optimizers.SGD)

    def step():
        optimizer.apply_gradients([(tf.constant([rank + 1.0, 2.0 * (rank + 1)]), variable)])

    step() if mode == "eager" else tf.function(step)()
    np.testing.assert_allclose(variable.numpy(), [-(size + 1) / 2, -(size + 1.0)])


def test_options_after_the_optimizer_follow_horovods_order(rank, size):
    # (optimizer, name, use_locking, device_dense, device_sparse, compression, sparse_as_dense,
    #  backward_passes_per_step, op)
    variable = keras.Variable(np.zeros(1, dtype="float32"))
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), "sgd", False, "", "",
                                         hvd.Compression.none, False, 1, hvd.Sum)
    optimizer.apply_gradients([(tf.constant([rank + 1.0]), variable)])
    np.testing.assert_allclose(variable.numpy(), [-size * (size + 1) / 2])


def test_other_optimizers_are_refused_before_any_collective():
    with pytest.raises(TypeError, match="wraps Keras optimizers .* not SGD; in a custom training loop"):
        hvd.DistributedOptimizer(type("SGD", (), {})())


def test_horovods_tf_keras_module_path_is_hvdplus_keras():
    import hvdplus.tensorflow.keras as hvd_keras
    from hvdplus.tensorflow.keras.callbacks import MetricAverageCallback

    assert hvd_keras is hvdplus.keras and hvd.keras is hvdplus.keras
    assert MetricAverageCallback is hvdplus.keras.callbacks.MetricAverageCallback
    assert hvd_keras.Compression.fp16 is hvdplus.keras.Compression.fp16
    assert hvd_keras.rank() == hvd.rank() and hvd_keras.nccl_built() == 0


V1_OPTIMIZERS = {"gradient-descent": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
                 "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
                 "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.5)}


def train_in_a_v1_graph(optimizer_of, batches):
    """A linear model trained by `optimizer_of()`'s minimize in a tf.compat.v1 graph run by a
    Session, one run per (x, y) of `batches`; its weights, global step and slot names after."""
    with tf.Graph().as_default():
        weights = tf.compat.v1.get_variable("weights", initializer=np.ones((3, 1), "float32"))
        step = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 3]), tf.compat.v1.placeholder(tf.float32, [None, 1])
        optimizer = optimizer_of()
        train = optimizer.minimize(tf.reduce_mean((tf.matmul(x, weights) - y) ** 2), global_step=step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for batch_x, batch_y in batches:
                session.run(train, {x: batch_x, y: batch_y})
            return session.run(weights), session.run(step), sorted(optimizer.get_slot_names())


@pytest.mark.parametrize("name, passes", [("gradient-descent", 1), ("adam", 1), ("momentum", 2)])
def test_v1_optimizer_in_a_graph_session_trains_like_one_process(name, passes, rank, size):
    # Each step's global batch is `passes` rows from every rank; this rank's take `passes` runs.
    steps, rng = 3, np.random.default_rng(4)
    x = rng.normal(size=(steps, size, passes, 3)).astype("float32")
    y = rng.normal(size=(steps, size, passes, 1)).astype("float32")
    reference = train_in_a_v1_graph(V1_OPTIMIZERS[name], [(x[k].reshape(-1, 3), y[k].reshape(-1, 1))
                                                          for k in range(steps)])
    distributed = train_in_a_v1_graph(
        lambda: hvd.DistributedOptimizer(V1_OPTIMIZERS[name](), backward_passes_per_step=passes,
                                         average_aggregated_gradients=True),
        [(x[k, rank, p:p + 1], y[k, rank, p:p + 1]) for k in range(steps) for p in range(passes)])
    np.testing.assert_allclose(distributed[0], reference[0], rtol=1e-5, atol=1e-6)
    assert distributed[1] == steps * passes  # the global step counts every pass, as in Horovod
    assert distributed[2] == reference[2]  # the wrapped optimizer's slots


def test_v1_optimizer_averages_eagerly(rank, size):
    variable = tf.Variable([0.0, 0.0])
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    assert optimizer.get_name() == "DistributedGradientDescentOptimizer"
    optimizer.minimize(lambda: tf.reduce_sum(variable * [rank + 1.0, 1.0]), var_list=[variable])
    np.testing.assert_allclose(variable.numpy(), [-(size + 1) / 2, -1.0])
