"""A Keras program written against Horovod's API (`import horovod.tensorflow.keras as hvd`),
run by tests/test_horovod_compat.py under `horovodrun` on 2 and 3 ranks: `model.fit` with
DistributedOptimizer and Horovod's callbacks, each rank on its rows of every batch, against
one process fitting the whole batches. Prints "keras program ok on rank <r>" at the end."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
PER_RANK, STEPS = 4, 5


def model(optimizer):
    tf.keras.utils.set_random_seed(9)
    net = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(5, activation="relu"),
                               tf.keras.layers.Dense(1)])
    net.compile(optimizer=optimizer, loss="mse")
    return net


rng = np.random.default_rng(4)
x = rng.standard_normal((STEPS * size * PER_RANK, 3)).astype(np.float32)
y = rng.standard_normal((STEPS * size * PER_RANK, 1)).astype(np.float32)
# Batch k of the whole data is rows [k*size*PER_RANK, (k+1)*size*PER_RANK); this rank's
# share of it is the rank-th PER_RANK of them.
mine = np.concatenate([np.arange(PER_RANK) + k * size * PER_RANK + rank * PER_RANK for k in range(STEPS)])

distributed = model(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)))
history = distributed.fit(x[mine], y[mine], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0,
                          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                     hvd.callbacks.MetricAverageCallback()])
reference = model(tf.keras.optimizers.SGD(0.05))
reference.fit(x, y, batch_size=size * PER_RANK, epochs=1, shuffle=False, verbose=0)
for a, b in zip(distributed.get_weights(), reference.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
# MetricAverageCallback: every rank logs the average of the ranks' epoch losses.
losses = hvd.allgather_object(history.history["loss"][-1])
assert all(abs(loss - losses[0]) < 1e-6 for loss in losses), losses
# A model Keras builds in its first step (no input shape), initialised differently on each
# rank: BroadcastGlobalVariablesCallback gives every rank rank 0's variables after that step.
tf.keras.utils.set_random_seed(100 + rank)
lazy = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu"), tf.keras.layers.Dense(1)])
lazy.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)), loss="mse")
lazy.fit(x[mine], y[mine], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0,
         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
weights = hvd.allgather_object([w.tolist() for w in lazy.get_weights()])
for other in weights[1:]:
    for a, b in zip(weights[0], other):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-7)
# local_variables keep each rank's own values: a bias set apart per rank stays apart by as
# much, since every rank applies the same averaged gradients to it.
apart = model(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)))
bias = apart.layers[-1].bias
bias.assign([float(rank)])
apart.fit(x[mine], y[mine], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, "", local_variables=[bias])])
biases = hvd.allgather_object(float(bias.numpy()[0]))
assert all(abs(b - biases[0] - r) < 1e-5 for r, b in enumerate(biases)), biases
print(f"keras program ok on rank {rank}", flush=True)
