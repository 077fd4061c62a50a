"""BalancedPyDataset and LoadBalanceCallback in Keras 3 model.fit on real ranks, once per backend:
while the balancer's sizes move, every sample is trained exactly once per epoch over the ranks,
each global batch split the same way on every rank, and the weights equal one process training
plain Keras on the same global batches (drawn here with numpy, not with hvdplus' code)."""

import functools

import numpy as np
import pytest

import keras
import hvdplus.keras as hvd

hvd.init()

# 5 global batches an epoch, the last of 9 samples: a share for every rank up to 3 ranks.
SAMPLES, GLOBAL_BATCH, EPOCHS, SEED = 57, 12, 2, 3
FEATURES, HIDDEN, OUTPUTS = 4, 5, 2


def data(samples=SAMPLES):
    rng = np.random.default_rng(11)
    return (rng.standard_normal((samples, FEATURES)).astype("float32"),
            rng.standard_normal((samples, OUTPUTS)).astype("float32"))


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                             keras.layers.Dense(OUTPUTS)])


def make_balancer():
    # Every step's measurement counts at once, and any change moves the sizes.
    return hvd.LoadBalancer(GLOBAL_BATCH, smoothing=1.0, hysteresis=0.0, warmup_steps=0)


class LoggedDataset(hvd.BalancedPyDataset):
    """Keeps the sample indices and sizes of every batch read during the fit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = []

    def share(self, epoch, index, sizes):
        ids = super().share(epoch, index, sizes)
        if self.steps.training:
            self.reads.append((epoch, index, ids.tolist(), list(sizes)))
        return ids


class SlowStartCallback(hvd.callbacks.LoadBalanceCallback):
    """The last rank's compute counts 3x slow for the fit's first half, then as fast as the
    others: the sizes move away from the even split and back while the fit runs."""

    def __init__(self, *args, half, **kwargs):
        super().__init__(*args, **kwargs)
        self.half = half
        self.sizes_after = []

    def compute_seconds(self, step, samples, seconds):
        last = self.balancer.process_set.size() - 1
        slow = 3.0 if self.balancer.process_set.rank() == last and step < self.half else 1.0
        return samples * 0.001 * slow

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.sizes_after.append(self.balancer.sizes())


@functools.lru_cache(maxsize=1)
def reference_weights(batches):
    """One process, plain Keras, SGD with momentum: each global batch of each epoch at once,
    from numpy's permutation of the samples with the seed plus the epoch."""
    x, y = data()
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    for epoch in range(EPOCHS):
        order = np.random.default_rng(SEED + epoch).permutation(SAMPLES)
        for index in range(batches):
            ids = order[index * GLOBAL_BATCH:(index + 1) * GLOBAL_BATCH]
            model.train_on_batch(x[ids], y[ids])
    return model.get_weights()


# 0: each step's batch waits for the sizes agreed at the end of the step before (TensorFlow's
# prefetch held back); 2: the sizes lag three steps, beyond the one batch a pipeline reads ahead
# here, so that sizes taken when a batch is read would split it otherwise on every backend.
@pytest.mark.parametrize("prefetch", [0, 2])
def test_fit_trains_every_sample_once_an_epoch_while_the_sizes_move(prefetch, rank, size):
    x, y = data()
    balancer = make_balancer()
    dataset = LoggedDataset(x, y, balancer, seed=SEED, prefetch=prefetch)
    batches = len(dataset)
    assert batches == 5
    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    callback = SlowStartCallback(dataset, optimizer, half=batches)
    model.fit(dataset, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[callback])

    # Each batch of each epoch was read once on this rank (later reads are past the fit's end).
    reads = [read for read in dataset.reads if read[0] < EPOCHS]
    assert sorted((epoch, index) for epoch, index, _, _ in reads) == [
        (epoch, index) for epoch in range(EPOCHS) for index in range(batches)]
    everyone = hvd.allgather_object({(epoch, index): (ids, sizes) for epoch, index, ids, sizes in reads})
    for epoch in range(EPOCHS):
        order = np.random.default_rng(SEED + epoch).permutation(SAMPLES)
        trained = []
        for index in range(batches):
            shares = [everyone[r][(epoch, index)] for r in range(size)]
            assert all(sizes == shares[0][1] for _, sizes in shares), (epoch, index, shares)
            # The ranks' shares, in rank order, are the global batch.
            batch = [sample for ids, _ in shares for sample in ids]
            assert batch == order[index * GLOBAL_BATCH:(index + 1) * GLOBAL_BATCH].tolist(), (epoch, index, shares)
            assert all(len(ids) > 0 for ids, _ in shares)
            trained += batch
        assert sorted(trained) == list(range(SAMPLES)), epoch

    # The sizes left the even split while the last rank was slow, and came back.
    if size > 1:
        history = callback.sizes_after
        assert all(sum(sizes) == GLOBAL_BATCH for sizes in history)
        assert history[0][-1] < GLOBAL_BATCH // size - 1 and history[-1][-1] >= GLOBAL_BATCH // size - 1, history
        used = {tuple(everyone[0][(epoch, index)][1]) for epoch in range(EPOCHS) for index in range(batches)}
        assert len(used) > 1, used

    reference = reference_weights(batches)
    for index, (got, want) in enumerate(zip(model.get_weights(), reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"variable {index}")


def test_keras_shuffling_the_batches_raises_on_every_rank(rank, size):
    # 30 batches: the chance that Keras' shuffle leaves them in order is nil.
    x, y = data(90)
    dataset = hvd.BalancedPyDataset(x, y, hvd.LoadBalancer(3), seed=SEED)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    with pytest.raises(RuntimeError, match=r"Keras read the batches out of order; give model.fit\(\.\.\., "
                                           r"shuffle=False\)"):
        model.fit(dataset, epochs=1, shuffle=True, verbose=0,
                  callbacks=[hvd.callbacks.LoadBalanceCallback(dataset, optimizer)])


def test_datasets_that_differ_between_ranks_raise_on_every_rank_naming_them(rank, size):
    x, y = data()
    dataset = hvd.BalancedPyDataset(x, y, make_balancer(), seed=rank)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    callback = hvd.callbacks.LoadBalanceCallback(dataset, optimizer)
    if size == 1:
        model.fit(dataset, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
        return
    listed = ", ".join(f"rank {r} has {r}" for r in range(size))
    with pytest.raises(ValueError, match=f"differ in seed: {listed}; give every rank the same"):
        model.fit(dataset, epochs=1, shuffle=False, verbose=0, callbacks=[callback])


def test_a_last_batch_too_small_to_share_is_refused():
    with pytest.raises(ValueError, match="leave some rank a batch with no samples"):
        hvd.BalancedPyDataset(*data(GLOBAL_BATCH + 1), hvd.LoadBalancer(GLOBAL_BATCH, min_batch_size=0))
