"""DistributedGradientTape: averaged gradients, one fused submission per gradient() call, and
a custom training loop on k ranks that equals one process with a k times larger batch.
Any number of ranks."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import hvdplus.core.collectives as collectives  # noqa: E402
import hvdplus.tensorflow as hvd  # noqa: E402
from testkit.tensorflow_modes import MODES, run  # noqa: E402

STEPS, BATCH, FEATURES, VOCABULARY = 4, 6, 3, 7


def model_variables():
    """An embedding table (its gradients are IndexedSlices) and a dense layer, seeded alike on every rank."""
    rng = np.random.default_rng(0)
    return [tf.Variable(rng.normal(size=(VOCABULARY, 2)).astype("float32"), name="embedding"),
            tf.Variable(rng.normal(size=(FEATURES + 2, 1)).astype("float32"), name="kernel"),
            tf.Variable(np.zeros(1, "float32"), name="bias")]


def loss_of(variables, ids, features, targets):
    table, kernel, bias = variables
    inputs = tf.concat([tf.gather(table, ids), features], axis=1)
    return tf.reduce_mean((tf.matmul(inputs, kernel) + bias - targets) ** 2)


def global_batches(size):
    """STEPS batches of size * BATCH rows, the same on every rank."""
    rng = np.random.default_rng(1)
    rows = STEPS * size * BATCH
    return (rng.integers(0, VOCABULARY, rows).astype("int32"), rng.normal(size=(rows, FEATURES)).astype("float32"),
            rng.normal(size=(rows, 1)).astype("float32"))


def sgd(variables, grads, lr=0.1):
    for variable, grad in zip(variables, grads):
        if isinstance(grad, tf.IndexedSlices):
            variable.scatter_sub(tf.IndexedSlices(grad.values * lr, grad.indices, grad.dense_shape))
        else:
            variable.assign_sub(grad * lr)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("options", [{}, {"sparse_as_dense": True}, {"compression": hvd.Compression.fp16}],
                         ids=["allgather-slices", "sparse-as-dense", "fp16"])
def test_k_ranks_with_batch_b_equal_one_process_with_batch_kb(options, mode, rank, size):
    ids, features, targets = global_batches(size)
    distributed, reference = model_variables(), model_variables()

    def distributed_step(ids, features, targets):
        with tf.GradientTape() as tape:
            loss = loss_of(distributed, ids, features, targets)
        tape = hvd.DistributedGradientTape(tape, **options)
        sgd(distributed, tape.gradient(loss, distributed))

    def reference_step(ids, features, targets):
        with tf.GradientTape() as tape:
            loss = loss_of(reference, ids, features, targets)
        sgd(reference, tape.gradient(loss, reference))

    distributed_step = distributed_step if mode == "eager" else tf.function(distributed_step)
    for step in range(STEPS):
        start = step * size * BATCH
        mine = slice(start + rank * BATCH, start + (rank + 1) * BATCH)
        distributed_step(ids[mine], features[mine], targets[mine])
        everyone = slice(start, start + size * BATCH)
        reference_step(ids[everyone], features[everyone], targets[everyone])
    tolerance = 2e-3 if "compression" in options else 1e-5
    for got, want in zip(distributed, reference):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tolerance, atol=tolerance)
    # And every rank holds the same weights, to the bit.
    for variable in distributed:
        np.testing.assert_array_equal(hvd.broadcast(variable, root_rank=0).numpy(), variable.numpy())


@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_one_call_are_submitted_together(mode, monkeypatch):
    submitted = []
    original = collectives.grouped_allreduce_async

    def recording(arrays, *args, **kwargs):
        submitted.append(len(arrays))
        return original(arrays, *args, **kwargs)

    monkeypatch.setattr(collectives, "grouped_allreduce_async", recording)
    variables = [tf.Variable(tf.ones([n])) for n in (1, 2, 3, 4)]

    def step():
        with tf.GradientTape() as tape:
            loss = sum(tf.reduce_sum(v) for v in variables)
        return hvd.DistributedGradientTape(tape).gradient(loss, variables)

    run(mode, step)
    assert submitted == [4]


@pytest.mark.parametrize("mode", MODES)
def test_sum_predivide_and_unused_variables(mode, rank, size):
    used, unused = tf.Variable(tf.ones([2])), tf.Variable(tf.ones([2]))

    def gradients(**options):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(used) * (rank + 1)
        return hvd.DistributedGradientTape(tape, **options).gradient(loss, {"used": used, "unused": unused})

    summed = run(mode, lambda: gradients(op=hvd.Sum))
    assert summed["unused"] is None
    np.testing.assert_allclose(summed["used"].numpy(), np.full(2, size * (size + 1) / 2))
    predivided = run(mode, lambda: gradients(gradient_predivide_factor=2.0))
    np.testing.assert_allclose(predivided["used"].numpy(), np.full(2, (size + 1) / 2), rtol=1e-6)


def test_wrapping_before_recording_and_persistent_tapes(rank, size):
    x = tf.Variable(2.0)
    with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = x * x * (rank + 1)
    assert isinstance(tape, tf.GradientTape)
    for _ in range(2):
        assert tape.gradient(loss, x).numpy() == pytest.approx(2.0 * (size + 1))


def test_reduce_ops_without_meaning_for_gradients_are_refused():
    with pytest.raises(ValueError, match="takes op Average or Sum, got Max"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Max)
    with pytest.raises(ValueError, match="gradient_predivide_factor needs op=Average"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0)


@pytest.mark.parametrize("mode", MODES)
def test_partial_tape_keeps_local_layers_gradients_and_scales_them(mode):
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(3)
    shared, local = tf.keras.layers.Dense(2), tf.keras.layers.Dense(1)
    x = tf.constant([[1.0 + rank, 2.0, -1.0]])
    local(shared(x))  # builds both layers
    variables = shared.trainable_weights + local.trainable_weights

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(local(shared(x)) ** 2)
        plain = tape.gradient(loss, variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(local(shared(x)) ** 2)
        partial = hvd.PartialDistributedGradientTape(tape, local_layers=local).gradient(loss, variables)
        return plain, partial

    plain, partial = run(mode, gradients)
    everyone = hvd.allgather_object([g.numpy() for g in plain]) if mode == "eager" else None
    for index, (mine, got) in enumerate(zip(plain, partial)):
        if index < len(shared.trainable_weights):  # shared: averaged over the ranks
            want = np.mean([grads[index] for grads in everyone], axis=0) if everyone else None
            if want is not None:
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
        else:  # local: this rank's own, divided by the size, as Horovod scales them
            np.testing.assert_allclose(got.numpy(), mine.numpy() / size, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_sync_batch_normalization_normalizes_with_the_global_batch(mode):
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(9)
    # Images (NHWC): tf_keras (TF_USE_LEGACY_KERAS=1) would normalize 4-D inputs with its fused
    # kernel, which computes this rank's statistics alone.
    everyone = [rng.normal(loc=r, scale=1 + r, size=(r + 2, 2, 2, 3)).astype("float32") for r in range(size)]
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    got = run(mode, lambda: layer(tf.constant(everyone[rank]), training=True))

    # One process, the whole batch: per channel, its mean and (biased) variance.
    whole = np.concatenate(everyone).astype("float64")
    mean, variance = whole.mean(axis=(0, 1, 2)), whole.var(axis=(0, 1, 2))
    want = (everyone[rank] - mean) / np.sqrt(variance + layer.epsilon)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.5 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.5 + 0.5 * variance, rtol=1e-5)
