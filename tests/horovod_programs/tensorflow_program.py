"""A TensorFlow 2 program written against Horovod's API (`import horovod.tensorflow as hvd`),
run by tests/test_horovod_compat.py under `horovodrun` on 2 and 3 ranks: its collectives and
DistributedGradientTape training against one process computing the same with numpy and
TensorFlow alone. Prints "tensorflow program ok on rank <r>" at the end."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

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
print(f"tensorflow program ok on rank {rank}", flush=True)
