"""hvdplus.keras on process sets, run once per backend (KERAS_BACKEND is set by the job): two
disjoint sets (the even and the odd ranks) each train a replica group of their own with
model.fit, against numpy; the optimizer's scale, the callbacks and the collectives on a set;
the ValueError of a rank outside the set. Needs two ranks."""

import re

import numpy as np
import pytest

import keras
import hvdplus.keras as hvd

from testkit.keras_callbacks import RecordLogs

hvd.init()

pytestmark = pytest.mark.skipif(hvd.size() < 2, reason="process sets other than the job's need two ranks")


@pytest.fixture
def sets(even_and_odd_sets):
    return even_and_odd_sets
STEPS, PER_RANK, LR = 3, 4, 0.1


def rank_data(rank):
    rng = np.random.default_rng([5, rank])
    return (rng.normal(size=(STEPS * PER_RANK, 3)).astype("float32"),
            rng.normal(size=(STEPS * PER_RANK, 1)).astype("float32"))


def make_model(kernel=0.5):
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(kernel), bias_initializer="zeros")])


def reference_weights(process_set):
    """Plain numpy: the linear model trained by SGD on the gradients of the mean squared
    error, averaged over the set's members, batch by batch."""
    kernel, bias = np.full((3, 1), 0.5), np.zeros(1)
    data = [rank_data(r) for r in process_set.ranks]
    for step in range(STEPS):
        rows = slice(step * PER_RANK, (step + 1) * PER_RANK)
        grads = []
        for x, y in data:
            residual = x[rows] @ kernel + bias - y[rows]
            grads.append((2 * x[rows].T @ residual / residual.size, 2 * residual.sum(0) / residual.size))
        kernel = kernel - LR * np.mean([g[0] for g in grads], axis=0)
        bias = bias - LR * np.mean([g[1] for g in grads], axis=0)
    return kernel, bias


def test_fit_trains_each_set_as_one_replica_group(sets):
    mine = sets[0]
    x, y = rank_data(hvd.rank())
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR), process_set=mine), loss="mse")
    model.fit(x, y, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    kernel, bias = reference_weights(mine)
    np.testing.assert_allclose(model.get_weights()[0], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.get_weights()[1], bias, rtol=1e-5, atol=1e-6)


def test_the_optimizers_scale_is_the_sets_and_a_rank_outside_applies_its_own(sets):
    mine, other = sets
    # gradient_predivide_factor divides by f, then by the set's size / f: the set's mean.
    for process_set, options, expected in [(mine, {}, np.mean(mine.ranks) + 1),
                                           (mine, {"gradient_predivide_factor": 2.0}, np.mean(mine.ranks) + 1),
                                           (mine, {"op": hvd.Sum}, np.sum(mine.ranks) + mine.size()),
                                           (other, {}, hvd.rank() + 1.0)]:  # Horovod's: no one to reduce with
        variable = keras.Variable(np.zeros(2, dtype="float32"))
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=process_set, **options)
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(np.full(2, hvd.rank() + 1.0, "float32")), variable)])
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), np.full(2, -expected), rtol=1e-6)


def test_callbacks_broadcast_from_a_job_rank_and_average_over_the_set(sets):
    mine = sets[0]
    root = mine.ranks[-1]
    model = make_model(kernel=float(hvd.rank()))  # every rank starts from its own weights
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0), process_set=mine), loss="mse")
    raw, averaged = RecordLogs(), RecordLogs()
    x, y = rank_data(hvd.rank())
    model.fit(x, y, batch_size=PER_RANK, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(root, process_set=mine), raw,
        hvd.callbacks.MetricAverageCallback(process_set=mine), averaged])
    np.testing.assert_array_equal(model.get_weights()[0], np.full((3, 1), float(root)))
    members = hvd.allgather_object(raw.epochs[0]["loss"], process_set=mine)
    assert len(members) == mine.size()
    assert averaged.epochs[0]["loss"] == pytest.approx(np.mean(members), rel=1e-6)


def test_collectives_on_a_set(sets):
    mine = sets[0]
    value = keras.ops.convert_to_tensor(np.full((2 * mine.size(), 2), float(hvd.rank()), "float32"))
    total = float(sum(mine.ranks))
    summed = hvd.allreduce(value, op=hvd.Sum, process_set=mine)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(summed), np.full((2 * mine.size(), 2), total))
    gathered = keras.ops.convert_to_numpy(hvd.allgather(value, process_set=mine))
    np.testing.assert_array_equal(gathered[::2 * mine.size(), 0], np.array(mine.ranks, dtype="float32"))
    root = mine.ranks[-1]
    given = keras.ops.convert_to_numpy(hvd.broadcast(value, root_rank=root, process_set=mine))
    np.testing.assert_array_equal(given, np.full((2 * mine.size(), 2), float(root)))
    block = keras.ops.convert_to_numpy(hvd.reducescatter(value, op=hvd.Sum, process_set=mine))
    np.testing.assert_array_equal(block, np.full((2, 2), total))
    assert hvd.broadcast_object(hvd.rank(), root_rank=root, process_set=mine) == root
    assert hvd.allgather_object(hvd.rank(), process_set=mine) == mine.ranks


def test_a_rank_outside_the_set_gets_the_cores_value_error(sets):
    other = sets[1]
    message = re.escape(f"on process set {other.ranks}, which does not include rank {hvd.rank()}")
    value = keras.ops.convert_to_tensor(np.ones((2, 2), "float32"))
    model = make_model()
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(other.ranks[0], process_set=other)
    broadcast.set_model(model)
    for call in [lambda: hvd.allreduce(value, process_set=other),
                 lambda: hvd.allgather(value, process_set=other),
                 lambda: hvd.broadcast(value, other.ranks[0], process_set=other),
                 lambda: hvd.reducescatter(value, process_set=other),
                 lambda: hvd.broadcast_object(1, other.ranks[0], process_set=other),
                 lambda: hvd.allgather_object(1, process_set=other),
                 broadcast.on_train_begin,
                 lambda: hvd.callbacks.MetricAverageCallback(process_set=other).on_epoch_end(0, {"loss": 1.0})]:
        with pytest.raises(ValueError, match=message):
            call()
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
