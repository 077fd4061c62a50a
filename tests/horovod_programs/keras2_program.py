"""A Keras 2 program written against Horovod's API, as Horovod's examples/tensorflow2 Keras
MNIST example is (`import horovod.tensorflow.keras as hvd`, a legacy optimizer with the
learning rate scaled by size, `experimental_run_tf_function=False`, the broadcast,
metric-average and warm-up callbacks), on made-up 8x8 images. tests/test_horovod_compat.py
runs it under `horovodrun` on 2 and 3 ranks with TF_USE_LEGACY_KERAS=1, where tf.keras is
tf_keras.

Each rank fits its rows of every batch; one process stepping through the whole batches by
hand (its own warm-up arithmetic, no hvdplus) is the reference for the weights and the
averaged epoch losses. Then the model saved and loaded back with hvd.load_model trains on
alike, and a legacy SGD's momentum follows a learning-rate change as Horovod corrects it.
Prints "keras2 program ok on rank <r>" at the end."""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402

assert tf.keras.Model.__module__.startswith("tf_keras."), f"run with TF_USE_LEGACY_KERAS=1, not {tf.keras.Model}"
assert hvd.DistributedOptimizer.__module__ == "hvdplus.tensorflow.keras2.optimizer", hvd.DistributedOptimizer

hvd.init()
rank, size = hvd.rank(), hvd.size()
PER_RANK, STEPS, EPOCHS, WARMUP = 4, 3, 2, 2
scaled_lr = 0.001 * size

rng = np.random.default_rng(5)
images = rng.random((STEPS * size * PER_RANK, 8, 8, 1)).astype(np.float32)
labels = rng.integers(0, 10, STEPS * size * PER_RANK).astype(np.int64)
# Batch k of the whole data is rows [k*size*PER_RANK, (k+1)*size*PER_RANK); this rank's
# share of it is the rank-th PER_RANK of them, so the shards of a step make its batch.
mine = np.concatenate([np.arange(PER_RANK) + k * size * PER_RANK + rank * PER_RANK for k in range(STEPS)])
batches = [(images[rows], labels[rows]) for rows in (slice(k * size * PER_RANK, (k + 1) * size * PER_RANK)
                                                   for k in range(STEPS))]


def mnist_model(seed):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, [3, 3], activation="relu", input_shape=(8, 8, 1)),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def reference_step(model, optimizer, x, y):
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.SparseCategoricalCrossentropy()(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return float(loss)


def assert_weights_equal(model, reference):
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


# -- Horovod's Keras MNIST example, on every rank's shard --------------------------------
model = mnist_model(seed=100 + rank)  # ranks start apart: the broadcast callback joins them
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(scaled_lr), backward_passes_per_step=1,
                               average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
              experimental_run_tf_function=False)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=WARMUP, verbose=1),
]
history = model.fit(images[mine], labels[mine], batch_size=PER_RANK, shuffle=False, epochs=EPOCHS,
                    callbacks=callbacks, verbose=1 if rank == 0 else 0)

# The reference: rank 0's initial model on the whole batches, the learning rate of
# Goyal et al.'s warm-up set before each step, and at the warm-up's end.
reference = mnist_model(seed=100)
reference_opt = tf.keras.optimizers.legacy.Adam(scaled_lr)
epoch_losses = []
for epoch in range(EPOCHS):
    losses = []
    for k, (x, y) in enumerate(batches):
        if epoch < WARMUP:
            progress = epoch + (k + 1) / STEPS
            reference_opt.learning_rate = scaled_lr / size * (1 + progress * (size - 1) / WARMUP)
        losses.append(reference_step(reference, reference_opt, x, y))
    epoch_losses.append(np.mean(losses))
    if epoch == WARMUP - 1:
        reference_opt.learning_rate = scaled_lr
assert_weights_equal(model, reference)
# MetricAverageCallback: each epoch's loss is the ranks' average, which is the whole batches'.
np.testing.assert_allclose(history.history["loss"], epoch_losses, rtol=1e-4)
np.testing.assert_allclose(history.history["lr"][-1], scaled_lr, rtol=1e-6)

# -- hvd.load_model: the optimizer comes back distributed, its Adam moments with it -------
if rank == 0:
    path = os.path.join(tempfile.mkdtemp(), "checkpoint.h5")
    model.save(path)
path = hvd.broadcast_object(path if rank == 0 else None)  # once written
loaded = hvd.load_model(path, legacy_opts=True)
assert type(loaded.optimizer).__mro__[1].__name__ == "_DistributedOptimizer", type(loaded.optimizer).__mro__
loaded.fit(images[mine[:PER_RANK]], labels[mine[:PER_RANK]], batch_size=PER_RANK, shuffle=False, verbose=0)
reference_step(reference, reference_opt, *batches[0])
assert_weights_equal(loaded, reference)

# -- momentum correction: a legacy SGD's momentum scaled by new_lr / old_lr for one step ----
sgd_model = mnist_model(seed=7)
sgd_model.compile(loss="sparse_categorical_crossentropy", experimental_run_tf_function=False,
                  optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)))
sgd_model.fit(images[mine], labels[mine], batch_size=PER_RANK, shuffle=False, epochs=2, verbose=0, callbacks=[
    hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda epoch: 0.5 ** epoch, staircase=True)])
reference = mnist_model(seed=7)
reference_opt = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
for epoch in range(2):
    for k, (x, y) in enumerate(batches):
        if epoch == 1:
            reference_opt.learning_rate = 0.05
            reference_opt.momentum = 0.45 if k == 0 else 0.9
        reference_step(reference, reference_opt, x, y)
assert_weights_equal(sgd_model, reference)
np.testing.assert_allclose(tf.keras.backend.get_value(sgd_model.optimizer.momentum), 0.9)
print(f"keras2 program ok on rank {rank}", flush=True)
