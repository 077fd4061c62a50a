"""hvdplus.keras with model.fit on k ranks against one process with the whole batch, run once
per backend (KERAS_BACKEND is set by the job)."""

import os

import numpy as np
import pytest

import keras
import hvdplus.keras as hvd

from testkit.keras_callbacks import RecordLogs

# tests/mpi/conftest.py has started hvdplus; Keras' own init also quiets Keras on ranks > 0.
hvd.init()

PER_RANK = 4
BATCHES = 6


def make_model(seed=0, hidden=8):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(hidden, activation="tanh"), keras.layers.Dense(3)])
    return model


def global_data(size, batches=BATCHES, per_rank=PER_RANK):
    rng = np.random.default_rng(7)
    rows = size * per_rank * batches
    return rng.normal(size=(rows, 5)).astype("float32"), rng.normal(size=(rows, 3)).astype("float32")


def rank_rows(array, rank, size, per_rank=PER_RANK):
    """This rank's part of every global batch, in batch order (no shuffling)."""
    batch = size * per_rank
    return np.concatenate([array[start + rank * per_rank:start + (rank + 1) * per_rank]
                           for start in range(0, len(array), batch)])


OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9), "adam": lambda: keras.optimizers.Adam(0.01)}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fit_on_k_ranks_equals_one_process(name, rank, size):
    x, y = global_data(size)
    reference = make_model()
    reference.compile(optimizer=OPTIMIZERS[name](), loss="mse")
    reference.fit(x, y, batch_size=size * PER_RANK, epochs=2, shuffle=False, verbose=0)

    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS[name]()), loss="mse")
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=2,
              shuffle=False, verbose=0)
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


class DelegatingSequential(keras.Sequential):
    """A model with a train_step of its own (here Keras' own, called through super): on the
    jax backend hvdplus cannot split it, and reduces in its host callback inside jit."""

    def train_step(self, *args):
        return super().train_step(*args)


# Several steps per call, where the backend takes them (Keras' torch trainer takes one).
STEPS_PER_EXECUTION = 1 if keras.backend.backend() == "torch" else 3


@pytest.mark.parametrize("model_class, steps_per_execution",
                         [(keras.Sequential, STEPS_PER_EXECUTION), (DelegatingSequential, 1)],
                         ids=["own-step", "custom-step"])
def test_fit_equals_one_process_with_keras_step_or_a_custom_one(model_class, steps_per_execution, rank, size):
    x, y = global_data(size)
    reference = make_model()
    reference.compile(optimizer=OPTIMIZERS["adam"](), loss="mse")
    reference.fit(x, y, batch_size=size * PER_RANK, epochs=2, shuffle=False, verbose=0)

    keras.utils.set_random_seed(0)
    model = model_class(make_model().layers)
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["adam"]()), loss="mse",
                  steps_per_execution=steps_per_execution)
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=2,
              shuffle=False, verbose=0)
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    if keras.backend.backend() == "jax":
        from hvdplus.keras.backends.jax import splits_its_step

        # Keras' own step is compiled in two halves around the host all-reduce; a custom one is not.
        assert splits_its_step(model) == (model_class is keras.Sequential)


def test_backward_passes_per_step_accumulate_like_a_larger_batch(rank, size):
    x, y = global_data(size * 2)
    reference = make_model()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=2 * size * PER_RANK, epochs=1, shuffle=False, verbose=0)

    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                         average_aggregated_gradients=True)
    model.compile(optimizer=optimizer, loss="mse")
    # Each rank's two micro-batches per step are rows of one global batch of 2*size*PER_RANK.
    mine_x = rank_rows(x, rank, size, per_rank=2 * PER_RANK)
    mine_y = rank_rows(y, rank, size, per_rank=2 * PER_RANK)
    model.fit(mine_x, mine_y, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_broadcast_callback_makes_ranks_identical(rank, size):
    model = make_model(seed=100 + rank)
    root_weights = hvd.broadcast_object(model.get_weights(), root_rank=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = global_data(1, batches=1)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for mine, root in zip(model.get_weights(), root_weights):
        np.testing.assert_array_equal(mine, root)


def test_metric_average_callback_averages_epoch_logs(rank, size):
    x, y = global_data(size)
    model = make_model(seed=rank)  # different models: different losses per rank
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=["mae"])
    raw, averaged = RecordLogs(), RecordLogs()
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=2, verbose=0,
              callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    everyone = hvd.allgather_object(raw.epochs)
    for epoch in range(2):
        for key in ("loss", "mae"):
            expected = np.mean([ranks_logs[epoch][key] for ranks_logs in everyone])
            assert averaged.epochs[epoch][key] == pytest.approx(expected, rel=1e-6)


class RecordLearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def test_warmup_and_schedule_learning_rates(rank, size):
    x, y = global_data(size, batches=4)
    steps = 4  # batches per epoch on each rank
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    recorder = RecordLearningRates()
    initial = 0.1 * size
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=4, verbose=0,
              shuffle=False, callbacks=[
                  # Horovod's positional order: momentum_correction comes before steps_per_epoch.
                  hvd.callbacks.LearningRateWarmupCallback(initial, 2, True, steps),
                  hvd.callbacks.LearningRateScheduleCallback(initial, multiplier=lambda e: 0.5 ** e, start_epoch=2),
                  recorder])
    expected = []
    for epoch in range(4):
        for batch in range(steps):
            if epoch < 2:  # Horovod counts the current batch: the epoch's last reaches a round number
                expected.append(initial / size * (1 + (epoch + (batch + 1) / steps) * (size - 1) / 2))
            else:
                expected.append(initial * 0.5 ** epoch)
    np.testing.assert_allclose(recorder.rates, expected, rtol=1e-6)


def test_save_and_load_round_trip_keeps_the_wrapper(rank, size, tmp_path_factory):
    x, y = global_data(size)
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=1, verbose=0)
    path = os.path.join(str(tmp_path_factory.mktemp(f"rank{rank}")), "model.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    assert hasattr(loaded.optimizer, "_hvdplus_configure")
    assert loaded.optimizer._hvdplus_compression is hvd.Compression.none
    # Horovod's positional order: filepath, custom_optimizers, custom_objects, compression.
    assert hvd.load_model(path, None, None, hvd.Compression.fp16).optimizer._hvdplus_compression is hvd.Compression.fp16
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    for mine, theirs in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs))
    loaded.fit(rank_rows(x, rank, size), rank_rows(y, rank, size), batch_size=PER_RANK, epochs=1, verbose=0)
    weights = hvd.allgather_object(loaded.get_weights())
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.skipif(hvd.size() < 2, reason="needs two ranks")
def test_models_that_differ_across_ranks_get_a_clear_error(rank):
    model = make_model(hidden=8 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = global_data(1, batches=1)
    mismatch = r"Mismatched shapes for 'model\.0\.sequential/dense/kernel'.*rank 0 had \(5, 8\), rank 1 had \(5, 9\)"
    with pytest.raises(hvd.TensorMismatchError, match=mismatch):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


@pytest.mark.skipif(hvd.size() < 2, reason="needs two ranks")
def test_differing_models_fail_in_the_training_step_on_every_rank_without_the_broadcast(rank):
    # Without the broadcast callback the gradients' all-reduce is the first collective: inside
    # tf.function, or jax.jit's host callback, the error still reaches every rank (JAX wraps it
    # in its own runtime error, whose message carries hvdplus').
    model = make_model(hidden=8 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = global_data(1, batches=1)
    with pytest.raises(Exception, match=r"Mismatched (member )?shapes"):
        model.fit(x, y, epochs=1, verbose=0)


@pytest.mark.skipif(hvd.size() < 2, reason="needs two ranks")
def test_gradients_of_other_shapes_but_as_many_elements_are_not_summed(rank):
    # The jax backend packs a step's gradients into one array; their shapes are compared all the same.
    shape = (4, 6) if rank == 0 else (6, 4)
    variable = keras.Variable(np.zeros(shape, dtype="float32"))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    with pytest.raises(Exception, match=r"Mismatched member shapes.*\(4, 6\).*\(6, 4\)"):
        optimizer.apply_gradients([(keras.ops.ones(shape), variable)])


def test_collectives_on_backend_tensors(rank, size):
    value = keras.ops.convert_to_tensor(np.full((2, 2), float(rank), dtype="float32"))
    summed = keras.ops.convert_to_numpy(hvd.allreduce(value, op=hvd.Sum))
    np.testing.assert_array_equal(summed, np.full((2, 2), size * (size - 1) / 2))
    gathered = keras.ops.convert_to_numpy(hvd.allgather(value))
    assert gathered.shape == (2 * size, 2)
    root = keras.ops.convert_to_numpy(hvd.broadcast(value, root_rank=size - 1))
    np.testing.assert_array_equal(root, np.full((2, 2), float(size - 1)))
    assert hvd.verbose() == (1 if rank == 0 else 0)


def test_collectives_take_horovods_arguments(rank, size):
    value = keras.ops.convert_to_tensor(np.full(3, 1 / 3 + rank, dtype="float32"))
    # allreduce(value, name, average, prescale_factor, postscale_factor, op, compression)
    summed = keras.ops.convert_to_numpy(hvd.allreduce(value, "keras.sum", False))
    np.testing.assert_allclose(summed, np.full(3, size / 3 + size * (size - 1) / 2), rtol=1e-6)
    mean = keras.ops.convert_to_numpy(hvd.allreduce(value, "keras.mean"))
    np.testing.assert_allclose(mean, np.full(3, 1 / 3 + (size - 1) / 2), rtol=1e-6)
    # On the wire as float16: each rank's value rounded there, the mean rounded once more.
    halves = [np.float16(1 / 3 + r).astype(np.float32) for r in range(size)]
    expected = np.float16(np.float32(sum(halves)) / np.float32(size)).astype(np.float32)
    compressed = hvd.allreduce(value, "keras.fp16", op=hvd.Average, compression=hvd.Compression.fp16)
    assert keras.backend.standardize_dtype(compressed.dtype) == "float32"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(compressed), np.full(3, expected))
    rows = keras.ops.convert_to_tensor(np.arange(2 * size * 2, dtype="float32").reshape(2 * size, 2) * (rank + 1))
    mine = keras.ops.convert_to_numpy(hvd.reducescatter(rows, "keras.rows", op=hvd.Sum))
    everyone = np.arange(2 * size * 2, dtype="float32").reshape(2 * size, 2) * size * (size + 1) / 2
    np.testing.assert_array_equal(mine, everyone[2 * rank:2 * rank + 2])


@pytest.mark.skipif(hvd.size() < 2, reason="a job of one applies its gradients as they are, as Horovod does")
def test_fp16_compression_rounds_the_gradients_on_the_wire(rank, size):
    # 1/3 is not a float16: through fp16 compression every rank applies float16(1/3), exactly
    # (its average over ranks is itself); without compression, float32(1/3).
    third = np.float32(1 / 3)
    for compression, applied in [(hvd.Compression.fp16, np.float16(third).astype(np.float32)),
                                 (hvd.Compression.none, third)]:
        variable = keras.Variable(np.zeros(3, dtype="float32"))
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=compression)
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(np.full(3, third)), variable)])
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), np.full(3, -applied))


def test_apply_gradients_averages_and_leaves_the_callers_gradients_alone(rank, size):
    variable = keras.Variable(np.zeros(3, dtype="float32"))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    grad = keras.ops.convert_to_tensor(np.full(3, rank + 1.0, dtype="float32"))
    optimizer.apply_gradients([(grad, variable)])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), np.full(3, -(size + 1) / 2))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(grad), np.full(3, rank + 1.0))


def test_partial_distributed_optimizer_keeps_local_layers_gradients(rank, size):
    def build():
        keras.utils.set_random_seed(4)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])

    rng = np.random.default_rng(rank)
    x, y = rng.normal(size=(5, 3)).astype("float32"), rng.normal(size=(5, 1)).astype("float32")
    plain, partial = build(), build()
    before = [w.copy() for w in plain.get_weights()]
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    plain.fit(x, y, batch_size=5, epochs=1, verbose=0)
    partial.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                                              local_layers=[partial.layers[1]]), loss="mse")
    partial.fit(x, y, batch_size=5, epochs=1, verbose=0)
    own_steps = [after - start for after, start in zip(plain.get_weights(), before)]
    everyone = hvd.allgather_object([step.tolist() for step in own_steps])
    for index, (after, start) in enumerate(zip(partial.get_weights(), before)):
        if index < 2:  # the first Dense: the ranks' steps averaged
            want = np.mean([np.array(steps[index]) for steps in everyone], axis=0)
        else:  # the local Dense: this rank's own step, divided by the number of ranks
            want = own_steps[index] / size
        np.testing.assert_allclose(after - start, want, rtol=1e-4, atol=1e-6)
