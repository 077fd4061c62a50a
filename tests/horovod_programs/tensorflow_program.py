"""A TensorFlow 2 program written against Horovod's API (`import horovod.tensorflow as hvd`),
run by tests/test_horovod_compat.py under `horovodrun` on 2 and 3 ranks: its collectives and
DistributedGradientTape training against one process computing the same with numpy and
TensorFlow alone. Prints "tensorflow program ok on rank <r>" at the end."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
from horovod.tensorflow.util import _executing_eagerly  # noqa: E402 (as Horovod's tests import it)

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert hvd.mpi_enabled() and not hvd.gloo_enabled()

every = np.array([[2 * r + 1, -(3 * r + 2), 7 * r] for r in range(size)], dtype=np.float64)
averaged = hvd.allreduce(tf.constant(every[rank], tf.int32))  # Average, Horovod's default
assert np.array_equal(averaged.numpy(), np.trunc(every.sum(0) / size).astype(np.int32)), averaged
gathered = hvd.allgather(tf.fill([rank + 1, 2], float(rank)))
assert np.array_equal(gathered.numpy(), np.concatenate([np.full((r + 1, 2), float(r)) for r in range(size)]))
assert np.array_equal(hvd.broadcast(tf.constant([rank, rank]), root_rank=size - 1).numpy(), [size - 1] * 2)


def model():
    tf.keras.utils.set_random_seed(5)
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(6, activation="tanh"),
                                tf.keras.layers.Dense(1)])


rng = np.random.default_rng(2)
batches = [(rng.standard_normal((2 * size, 4)).astype(np.float32),
            rng.standard_normal((2 * size, 1)).astype(np.float32)) for _ in range(4)]
mine, reference = model(), model()
hvd.broadcast_variables(mine.variables, root_rank=0)
optimizer, plain = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)


@tf.function
def distributed_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(mine(x) - y))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, mine.trainable_variables)
    optimizer.apply_gradients(zip(grads, mine.trainable_variables))


for x, y in batches:
    distributed_step(x[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(reference(x) - y))
    plain.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables))
for a, b in zip(mine.variables, reference.variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


# PartialDistributedGradientTape on Keras 3 variables, as Horovod's test drives it: the first
# layers stay local (their gradients divided by the size), the others are averaged.
def ranked_model(r):
    start = tf.keras.initializers.Constant(r + 0.5)
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, kernel_initializer=start),
                                tf.keras.layers.RepeatVector(3),
                                tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(3, kernel_initializer=start))])


def gradients_of(net, tape_class=None, local_layers=None):
    x, y = np.linspace(-1, 1, 3, dtype=np.float32)[None], np.linspace(0, 1, 9, dtype=np.float32).reshape(1, 3, 3)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(net(x) - y))
    if tape_class is None:
        return [g.numpy() for g in tape.gradient(loss, net.trainable_weights)]
    tape = tape_class(tape, local_layers=local_layers)
    return tape.get_local_and_global_gradients(loss, net.trainable_weights)


plain_gradients = [gradients_of(ranked_model(r)) for r in range(size)]
for local_count in (1, 2):
    net = ranked_model(rank)
    local_layers = net.layers[:local_count]
    local_pairs, global_pairs = gradients_of(net, hvd.PartialDistributedGradientTape, local_layers)
    local_count_weights = sum(len(layer.trainable_weights) for layer in local_layers)
    assert [v for v, _ in local_pairs] == net.trainable_weights[:local_count_weights]
    for index, (variable, grad) in enumerate(local_pairs + global_pairs):
        expected = (plain_gradients[rank][index] / size if index < local_count_weights
                    else np.mean([plain_gradients[r][index] for r in range(size)], axis=0))
        np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-5, atol=1e-6)

# IndexedSlices: Average divides float32 values in float32; a group mixes them with dense
# tensors; other ops and scale factors raise NotImplementedError, as in Horovod.
slice_values = tf.constant([[rank + 1.0, 2.0 * rank]], tf.float32)
embedding_grad = tf.IndexedSlices(slice_values, tf.constant([rank]), tf.constant([size, 2]))
table = np.array([[r + 1.0, 2.0 * r] for r in range(size)])
for call in (lambda: hvd.allreduce(embedding_grad, op=hvd.Average),
             tf.function(lambda: hvd.grouped_allreduce([embedding_grad, tf.ones([2]) * rank])[0])):
    averaged_slices = call()
    assert averaged_slices.values.dtype == tf.float32
    np.testing.assert_allclose(tf.convert_to_tensor(averaged_slices).numpy(), table / size, rtol=1e-6)
mixed = hvd.grouped_allreduce([tf.ones([2]) * rank, embedding_grad, tf.constant(rank)], op=hvd.Sum)
np.testing.assert_allclose(mixed[0].numpy(), [size * (size - 1) / 2] * 2)
np.testing.assert_allclose(tf.convert_to_tensor(mixed[1]).numpy(), table)
assert mixed[2].numpy() == size * (size - 1) // 2
for refused in (dict(op=hvd.Min), dict(op=hvd.Max), dict(op=hvd.Product), dict(op=hvd.Adasum),
                dict(op=hvd.Sum, prescale_factor=2.0), dict(postscale_factor=0.5)):
    try:
        hvd.allreduce(embedding_grad, **refused)
    except NotImplementedError:
        pass
    else:
        raise AssertionError(f"allreduce of IndexedSlices with {refused} did not raise NotImplementedError")

# An alltoall whose rows the ranks cannot split evenly, and no splits: InvalidArgumentError,
# eagerly and in a tf.function.
for call in (hvd.alltoall, tf.function(hvd.alltoall)):
    try:
        call(tf.ones([size + 1, 2]))
    except tf.errors.InvalidArgumentError:
        pass
    else:
        raise AssertionError("an uneven alltoall without splits did not raise InvalidArgumentError")

# Process sets as Horovod's test_horovod_allreduce_process_set_id_error drives them: a set
# without this rank raises InvalidArgumentError, one with a forged id ValueError; the private
# names Horovod's tests read, served by the alias.
assert _executing_eagerly() and hvd._executing_eagerly() and hvd.util._executing_eagerly()
assert not tf.function(hvd._executing_eagerly)()
first, rest = hvd.add_process_set([0]), hvd.add_process_set(range(1, size))
assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {
    0: list(range(size)), first.process_set_id: [0], rest.process_set_id: list(range(1, size))}
for call in (hvd.allreduce, tf.function(hvd.allreduce)):
    try:
        call(tf.ones(4), process_set=rest if rank == 0 else first)
    except tf.errors.InvalidArgumentError as error:
        assert f"which does not include rank {rank}" in str(error), error
    else:
        raise AssertionError("an allreduce on a set without this rank did not raise InvalidArgumentError")
forged = hvd.ProcessSet([0])
forged.process_set_id = 10
try:
    hvd.allreduce(tf.ones(4), process_set=forged)
except tf.errors.InvalidArgumentError:
    raise AssertionError("a forged process set id raised InvalidArgumentError, not ValueError") from None
except ValueError:
    pass
else:
    raise AssertionError("an allreduce on a forged process set id did not raise ValueError")
hvd.remove_process_set(first)
hvd.remove_process_set(rest)

# SyncBatchNormalization takes Horovod's fused=False; its statistics cover every rank's rows.
rows = np.arange(4 * size * 3, dtype=np.float32).reshape(4 * size, 3) ** 1.5
normalized = hvd.SyncBatchNormalization(fused=False)(rows[4 * rank:4 * rank + 4], training=True)
expected = tf.keras.layers.BatchNormalization()(rows, training=True).numpy()[4 * rank:4 * rank + 4]
np.testing.assert_allclose(normalized.numpy(), expected, rtol=1e-4, atol=1e-4)

# broadcast_variables in a tf.compat.v1 graph built after hvd.init().
with tf.Graph().as_default():
    graph_variable = tf.compat.v1.get_variable("v", initializer=tf.fill([2], float(rank)))
    sync = hvd.broadcast_variables([graph_variable], root_rank=size - 1)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(sync)
        np.testing.assert_array_equal(session.run(graph_variable), [size - 1.0] * 2)
print(f"tensorflow program ok on rank {rank}", flush=True)
