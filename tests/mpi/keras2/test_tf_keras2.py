"""hvdplus' TensorFlow paths where tf.keras is tf_keras (Keras 2, TF_USE_LEGACY_KERAS=1): the
optimizers' gradient accumulation and PartialDistributedOptimizer in model.fit, a model built
in a tf.compat.v1 graph (broadcast, fit and the callbacks), SyncBatchNormalization over several
axes and the elastic Keras state, each on k ranks against one process (or numpy). Any number
of ranks."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import hvdplus.tensorflow as hvd_tf
import hvdplus.tensorflow.keras as hvd
from hvdplus.tensorflow.elastic import TensorFlowKerasState
from testkit.weighted_reference import counts, numpy_weighted_average, values_of

PER_RANK, FEATURES, OUTPUTS = 4, 3, 2
OPTIMIZERS = {"sgd": lambda lr: tf.keras.optimizers.SGD(lr, momentum=0.5),
              "legacy-sgd": lambda lr: tf.keras.optimizers.legacy.SGD(lr, momentum=0.5)}


def make_model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(FEATURES,)),
                                tf.keras.layers.Dense(OUTPUTS)])


def whole_data(size, batches, per_rank=PER_RANK):
    """`batches` global batches of size * per_rank rows, the same on every rank."""
    rng = np.random.default_rng(11)
    rows = batches * size * per_rank
    return rng.normal(size=(rows, FEATURES)).astype("float32"), rng.normal(size=(rows, OUTPUTS)).astype("float32")


def rank_rows(array, rank, size, per_rank=PER_RANK):
    """This rank's part of every global batch, in batch order."""
    batch = size * per_rank
    return np.concatenate([array[start + rank * per_rank:start + (rank + 1) * per_rank]
                           for start in range(0, len(array), batch)])


def assert_weights_close(got, want):
    for mine, theirs in zip(got, want):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def mse(model, x, y):
    return tf.keras.losses.MeanSquaredError()(y, model(x, training=True))


@pytest.mark.parametrize("name, average, mode", [
    ("sgd", True, "function"), ("legacy-sgd", False, "function"), ("legacy-sgd", True, "eager"),
    ("sgd", False, "eager"), ("legacy-sgd", False, "v1-graph")])
def test_backward_passes_per_step_apply_the_passes_all_reduced_every_n_passes(name, average, mode, rank, size):
    passes, updates = 2, 3
    x, y = whole_data(size, updates, per_rank=passes * PER_RANK)
    # One process, one step per update on the rows of all its passes on every rank: summed
    # passes make `passes` times that batch's mean gradient.
    reference = make_model()
    reference.compile(optimizer=OPTIMIZERS[name](0.1 if average else 0.1 * passes), loss="mse")
    reference.fit(x, y, batch_size=passes * size * PER_RANK, shuffle=False, verbose=0)
    # Read now: a model made in a v1 graph gives tf_keras' model classes their v1 methods.
    want, initial = reference.get_weights(), make_model().get_weights()

    mine = [rank_rows(data, rank, size, per_rank=passes * PER_RANK) for data in (x, y)]
    with tf.Graph().as_default() if mode == "v1-graph" else contextlib.nullcontext():
        model = make_model()
        model.set_weights(initial)  # a graph's random ops draw other numbers
        optimizer = hvd.DistributedOptimizer(OPTIMIZERS[name](0.1), backward_passes_per_step=passes,
                                             average_aggregated_gradients=average)
        model.compile(optimizer=optimizer, loss="mse")
        model.run_eagerly = mode == "eager"
        model.fit(*mine, batch_size=PER_RANK, shuffle=False, verbose=0)
        trained, iterations = model.get_weights(), tf.keras.backend.get_value(optimizer.iterations)
    assert_weights_close(trained, want)
    assert iterations == passes * updates  # every pass counts, as in Horovod


def test_tensorflows_distributed_optimizer_wraps_tf_keras_optimizers(rank, size):
    optimizer = hvd_tf.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0), op=hvd_tf.Sum)
    assert isinstance(optimizer, tf.keras.optimizers.legacy.SGD)
    variable = tf.Variable([0.0, 0.0])
    optimizer.minimize(lambda: tf.reduce_sum(variable * [rank + 1.0, 1.0]), [variable])
    np.testing.assert_allclose(variable.numpy(), [-size * (size + 1) / 2, -size])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_partial_distributed_optimizer_keeps_the_local_layers_gradients(name, rank, size):
    x, y = whole_data(size, batches=3)
    model = make_model()
    model.compile(optimizer=hvd.PartialDistributedOptimizer(OPTIMIZERS[name](0.1), local_layers=[model.layers[1]]),
                  loss="mse")
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, shuffle=False, verbose=0)

    # One process holding every rank's replica: each step, the replicas' gradients of the
    # shared layer averaged, and each one's own of its local layer divided by the size
    # (scale_local_gradients); the local layers, and so the shared gradients, drift apart.
    replicas = [make_model() for _ in range(size)]
    optimizers = [OPTIMIZERS[name](0.1) for _ in range(size)]
    for start in range(0, len(x), size * PER_RANK):
        grads = []
        for r, replica in enumerate(replicas):
            rows = slice(start + r * PER_RANK, start + (r + 1) * PER_RANK)
            with tf.GradientTape() as tape:
                loss = mse(replica, x[rows], y[rows])
            grads.append(tape.gradient(loss, replica.trainable_variables))
        shared = [tf.reduce_mean(tf.stack(same), axis=0) for same in zip(*(g[:2] for g in grads))]
        for replica, optimizer, own in zip(replicas, optimizers, grads):
            optimizer.apply_gradients(zip(shared + [grad / size for grad in own[2:]], replica.trainable_variables))
    assert_weights_close(model.get_weights(), replicas[rank].get_weights())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_partial_distributed_optimizers_compute_gradients_as_horovods_tests_call_it(name, rank, size):
    x, y = whole_data(size, batches=1)
    model = make_model(seed=rank)  # ranks apart: their gradients differ
    with tf.GradientTape(persistent=True) as tape:
        loss = mse(model, rank_rows(x, rank, size), rank_rows(y, rank, size))
    own = [grad.numpy() for grad in tape.gradient(loss, model.trainable_weights)]
    optimizer = hvd.PartialDistributedOptimizer(OPTIMIZERS[name](0.1), local_layers=[model.layers[1]])
    got = optimizer._compute_gradients(loss, model.trainable_weights, tape=tape)
    everyone = hvd.allgather_object(own)
    for index, (grad, variable) in enumerate(got):
        assert variable is model.trainable_weights[index]
        want = own[index] / size if index >= 2 else np.mean([grads[index] for grads in everyone], axis=0)
        np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-6)


def test_model_in_a_v1_graph_broadcasts_and_fits_with_the_callbacks_like_one_process(rank, size):
    x, y = whole_data(size, batches=3)
    mine = [rank_rows(data, rank, size) for data in (x, y)]
    with tf.Graph().as_default():
        model = make_model(seed=100 + rank)  # the ranks start apart
        session = tf.compat.v1.keras.backend.get_session()
        session.run(hvd_tf.broadcast_variables(model.variables, root_rank=0))  # an op, in a v1 graph
        root = hvd.broadcast_object(model.get_weights(), root_rank=0)
        for mine_weights, root_weights in zip(model.get_weights(), root):
            np.testing.assert_array_equal(mine_weights, root_weights)
        model.set_weights([w + rank for w in root])  # apart again, for the broadcast callback
        model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)),
                      loss="mse")
        history = model.fit(*mine, batch_size=PER_RANK, epochs=2, shuffle=False, verbose=0, callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
            hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda epoch: 0.5 ** epoch)])
        trained = model.get_weights()

    # One process, eagerly: rank 0's weights on the whole batches; in epoch 1 the learning
    # rate halves, and the momentum with it for that epoch's first step (momentum_correction).
    reference, optimizer = make_model(), tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    reference.set_weights(root)
    epoch_losses = []
    for epoch in range(2):
        losses = []
        for step, start in enumerate(range(0, len(x), size * PER_RANK)):
            if epoch == 1:
                optimizer.learning_rate, optimizer.momentum = 0.05, 0.45 if step == 0 else 0.9
            everyone = slice(start, start + size * PER_RANK)
            with tf.GradientTape() as tape:
                loss = mse(reference, x[everyone], y[everyone])
            optimizer.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                          reference.trainable_variables))
            losses.append(float(loss))
        epoch_losses.append(np.mean(losses))
    assert_weights_close(trained, reference.get_weights())
    np.testing.assert_allclose(history.history["loss"], epoch_losses, rtol=1e-4)  # the ranks' average
    np.testing.assert_allclose(history.history["lr"], [0.1, 0.05], rtol=1e-6)


def test_sync_batch_normalization_over_several_axes_takes_every_ranks_rows(rank, size):
    # tf_keras takes a list of axes, and asks for their statistics with the reduced axes kept.
    rng = np.random.default_rng(5)
    everyone = [rng.normal(loc=r, size=(r + 2, 2, 3, 4)).astype("float32") for r in range(size)]
    layer = hvd_tf.SyncBatchNormalization(axis=[1, 3])
    got = layer(tf.constant(everyone[rank]), training=True)
    whole = np.concatenate(everyone).astype("float64")
    mean, variance = whole.mean(axis=(0, 2), keepdims=True), whole.var(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(got.numpy(), (everyone[rank] - mean) / np.sqrt(variance + layer.epsilon),
                               rtol=1e-4, atol=1e-4)


def test_tensorflow_keras_state_restores_its_commit_and_syncs_rank_0s_values(rank, size):
    x, y = whole_data(size, batches=1)
    model = make_model(seed=rank)
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.01)), loss="mse")
    state = TensorFlowKerasState(model, epoch=3)
    assert len(model.optimizer.variables()) > 1  # its slots, made to be kept
    committed = model.get_weights()
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, verbose=0)
    state.epoch = 4
    state.restore()
    assert state.epoch == 3 and model.optimizer.iterations.numpy() == 0
    assert_weights_close(model.get_weights(), committed)
    state.sync()
    root = hvd.broadcast_object(model.get_weights(), root_rank=0)
    for mine, theirs in zip(model.get_weights(), root):
        np.testing.assert_array_equal(mine, theirs)


def test_allreduce_with_a_weight_is_the_weighted_average(rank, size):
    weights = counts(size)
    expected = numpy_weighted_average([values_of(r) for r in range(size)], weights)
    result = hvd.allreduce(values_of(rank).astype("float32"), weight=weights[rank], name="weighted.keras2")
    np.testing.assert_allclose(np.asarray(result), expected, rtol=1e-6, atol=1e-6)
