"""hvdplus.tensorflow.DistributedOptimizer and Horovod's `hvdplus.tensorflow.keras` path: a
tf.keras optimizer's gradients are averaged over ranks, eagerly and inside tf.function.
Any number of ranks."""

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
