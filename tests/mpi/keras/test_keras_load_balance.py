"""Weighted averages in hvdplus.keras on real ranks, once per Keras backend: allreduce(weight=)
against numpy, and DistributedOptimizer over uneven local batches (by `local_samples=`,
`set_local_samples(n)` or a LoadBalancer whose sizes change between steps) against one process
training plain Keras on the union of the batches, in the same rank."""

import numpy as np
import pytest

import keras
import hvdplus.keras as hvd

from testkit.weighted_reference import counts, numpy_weighted_average, values_of
from testkit import weighted_reference

hvd.init()

STEPS = 10
FEATURES, HIDDEN, OUTPUTS = 6, 8, 3
OPTIMIZERS = {"sgd-momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
              "adam": lambda: keras.optimizers.Adam(0.01)}


def test_weighted_allreduce_equals_numpy():
    rank, size = hvd.rank(), hvd.size()
    weights = counts(size)
    expected = numpy_weighted_average([values_of(r) for r in range(size)], weights)
    result = hvd.allreduce(keras.ops.convert_to_tensor(values_of(rank).astype("float32")), op=hvd.Average,
                           weight=keras.ops.convert_to_tensor(float(weights[rank])), name="weighted.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(result), expected, rtol=1e-6, atol=1e-6)


def test_a_weight_with_another_op_raises_on_every_rank_naming_the_tensor():
    with pytest.raises(ValueError, match=r"'weighted\.keras\.sum'.*op=Average"):
        hvd.allreduce(np.ones(3, "float32"), op=hvd.Sum, weight=1.0, name="weighted.keras.sum")


# -- DistributedOptimizer over uneven batches ------------------------------------------------
def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                             keras.layers.Dense(OUTPUTS)])


def global_batches(total, steps=STEPS):
    return weighted_reference.global_batches(total, steps, FEATURES, OUTPUTS)


def union_training(optimizer_name, batches):
    """The independent reference: one process, plain Keras, every rank's samples at once."""
    model = make_model()
    model.compile(optimizer=OPTIMIZERS[optimizer_name](), loss="mse")
    for x, y in batches:
        model.train_on_batch(x, y)
    return model.get_weights()


def assert_same_weights(model, reference):
    for index, (got, want) in enumerate(zip(model.get_weights(), reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"variable {index}")


def wrappers():
    """The ways to wrap a Keras 3 optimizer: hvdplus.keras', and on the TensorFlow backend
    hvdplus.tensorflow's (Horovod's `horovod.tensorflow.DistributedOptimizer`)."""
    found = {"hvdplus.keras": hvd.DistributedOptimizer}
    if keras.backend.backend() == "tensorflow":
        import hvdplus.tensorflow as hvd_tf

        found["hvdplus.tensorflow"] = hvd_tf.DistributedOptimizer
    return found


@pytest.mark.parametrize("wrapper", list(wrappers()))
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_uneven_batches_in_fit_train_like_one_process_on_their_union(optimizer_name, wrapper, rank, size):
    sizes = counts(size)
    start = sum(sizes[:rank])
    batches = global_batches(sum(sizes))
    # This rank's rows of every global batch, one local batch after another.
    x = np.concatenate([bx[start:start + sizes[rank]] for bx, _ in batches])
    y = np.concatenate([by[start:start + sizes[rank]] for _, by in batches])
    model = make_model()
    optimizer = wrappers()[wrapper](OPTIMIZERS[optimizer_name](), local_samples=sizes[rank])
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=sizes[rank], epochs=1, shuffle=False, verbose=0)
    assert_same_weights(model, union_training(optimizer_name, batches))


class DelegatingSequential(keras.Sequential):
    """A train_step of its own (Keras', through super): on the jax backend the all-reduce then
    runs in a host callback inside the compiled step, which must read the count there."""

    def train_step(self, *args):
        return super().train_step(*args)


@pytest.mark.parametrize("model_class", [keras.Sequential, DelegatingSequential], ids=["own-step", "custom-step"])
def test_a_count_set_between_compiled_steps_is_the_one_they_use(model_class, rank, size):
    sizes = counts(size)
    start = sum(sizes[:rank])
    batches = global_batches(sum(sizes))
    model = model_class(make_model().layers)
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS["adam"]())
    model.compile(optimizer=optimizer, loss="mse")
    union = []
    for step, (x, y) in enumerate(batches):
        # Every step has the same shapes, so one compiled step runs them all; on odd steps the
        # last rank's samples count for nothing, which only a count read as the step runs sees.
        left_out = size > 1 and step % 2 == 1
        optimizer.set_local_samples(0 if left_out and rank == size - 1 else sizes[rank])
        model.train_on_batch(x[start:start + sizes[rank]], y[start:start + sizes[rank]])
        kept = sum(sizes[:-1]) if left_out else sum(sizes)
        union.append((x[:kept], y[:kept]))
    assert_same_weights(model, union_training("adam", union))


@pytest.mark.parametrize("counted_by", ["load_balancer", "set_local_samples"])
def test_a_load_balancers_sizes_weigh_the_gradients_as_they_change(counted_by, rank, size):
    global_batch = 60
    balancer = hvd.LoadBalancer(global_batch, smoothing=1.0, hysteresis=0.0, warmup_steps=0)
    optimizer = OPTIMIZERS["sgd-momentum"]()
    if counted_by == "load_balancer":
        optimizer = hvd.DistributedOptimizer(optimizer, load_balancer=balancer)
    else:
        optimizer = hvd.DistributedOptimizer(optimizer)
    model = make_model()
    model.compile(optimizer=optimizer, loss="mse")
    batches = global_batches(global_batch)
    history = []
    for step, (x, y) in enumerate(batches):
        mine = balancer.slice(np.arange(global_batch))
        if counted_by == "set_local_samples":
            optimizer.set_local_samples(len(mine))
        # The compiled step is reused across sizes: the count must be read as each step runs.
        model.train_on_batch(x[mine], y[mine])
        history.append(weighted_reference.record_a_slow_start(balancer, len(mine), step, STEPS))
    weighted_reference.assert_the_sizes_moved(history, global_batch, size)
    assert_same_weights(model, union_training("sgd-momentum", batches))


def test_weighting_with_another_op_is_refused(rank, size):
    with pytest.raises(ValueError, match="weighting gradients by local sample counts needs op=Average, got op=Sum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum, local_samples=3)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum)
    with pytest.raises(ValueError, match=r"set_local_samples\(\): .*needs op=Average, got op=Sum"):
        optimizer.set_local_samples(3)


def test_a_negative_count_on_one_rank_raises_on_every_rank_naming_it(rank, size):
    sizes = counts(size)
    bad = size - 1
    samples = -3 if rank == bad else sizes[rank]
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), local_samples=samples), loss="mse")
    x, y = global_batches(sizes[rank], steps=1)[0]
    if size == 1:  # nothing to average with: the count is not used
        model.train_on_batch(x, y)
        return
    # The backends raise their own classes (TensorFlow's InvalidArgumentError for a ValueError).
    with pytest.raises(Exception, match=rf"rank {bad} gave weight -3(\.0)?; a weight must be a finite number of 0"):
        model.train_on_batch(x, y)


# -- MetricAverageCallback over uneven data -------------------------------------------------
def rank_data(rank, rows):
    rng = np.random.default_rng([9, rank])
    return (rng.standard_normal((rows, FEATURES)).astype("float32"),
            rng.standard_normal((rows, OUTPUTS)).astype("float32"))


def mean_squared_error(model, x, y):
    """The model's mean squared error on (x, y), in numpy from its predictions."""
    return float(np.mean((model.predict(x, verbose=0).astype(np.float64) - y) ** 2))


@pytest.mark.parametrize("counted_by", ["local_samples", "load_balancer", "unweighted"])
def test_metric_average_weighs_each_ranks_logs_by_its_samples(counted_by, rank, size):
    steps = 3
    balancer = hvd.LoadBalancer(60, smoothing=1.0, hysteresis=0.0, warmup_steps=0)
    balancer.record(20, 0.001 * 20 * (1 + rank))  # rank r is 1 + r times slower than rank 0
    balancer.rebalance()
    batches = balancer.sizes() if counted_by == "load_balancer" else counts(size)
    data = [rank_data(r, steps * batches[r]) for r in range(size)]
    callback = {"local_samples": lambda: hvd.callbacks.MetricAverageCallback(local_samples=len(data[rank][0])),
                "load_balancer": lambda: hvd.callbacks.MetricAverageCallback(load_balancer=balancer),
                "unweighted": hvd.callbacks.MetricAverageCallback}[counted_by]()
    model = make_model()
    # A learning rate of 0: the epoch's loss is the untrained model's mean over the rank's samples.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    logs = model.fit(*data[rank], batch_size=batches[rank], epochs=1, shuffle=False, verbose=0,
                     callbacks=[callback]).history
    losses = [mean_squared_error(model, x, y) for x, y in data]
    weights = None if counted_by == "unweighted" else [len(x) for x, _ in data]
    np.testing.assert_allclose(logs["loss"][0], np.average(losses, weights=weights), rtol=1e-5)
    if size > 1 and weights is not None:  # the plain average differs where the counts do
        assert len(set(batches)) > 1 and not np.isclose(logs["loss"][0], np.mean(losses), rtol=1e-4)
