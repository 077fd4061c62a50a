"""A Keras 2 elastic program shaped like Horovod's examples/elastic/tensorflow2 Keras MNIST
example: `hvd.elastic.KerasState`, the three elastic callbacks and `hvd.elastic.run` around
`model.fit` on a tf.data dataset, with TensorFlow 2.11+'s Adam (not a legacy one), on
made-up 8x8 images. tests/test_horovod_compat.py runs it under `horovodrun` on 2 and 3
ranks with TF_USE_LEGACY_KERAS=1, where tf.keras is tf_keras.

No rank fails here: the run's first sync must give every rank rank 0's model, the
callbacks must count epochs and batches and commit, and the weights must be those of one
process stepping through the whole batches by hand. Then `restore()` brings the last commit
back and `sync()` rank 0's values. Prints "keras2_elastic program ok on rank <r>"."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402
import horovod.tensorflow.keras.elastic  # noqa: E402
from horovod.tensorflow.elastic import TensorFlowKerasState  # noqa: E402

assert tf.keras.Model.__module__.startswith("tf_keras."), f"run with TF_USE_LEGACY_KERAS=1, not {tf.keras.Model}"
# Every path Horovod's programs take to the Keras state is tf_keras'.
assert horovod.tensorflow.keras.elastic.KerasState is TensorFlowKerasState is hvd.elastic.KerasState
assert TensorFlowKerasState.__module__ == "hvdplus.tensorflow.keras2.elastic", TensorFlowKerasState

hvd.init()
rank, size = hvd.rank(), hvd.size()
PER_RANK, STEPS, EPOCHS = 4, 3, 2

rng = np.random.default_rng(6)
images = rng.random((STEPS * size * PER_RANK, 8, 8, 1)).astype(np.float32)
labels = rng.integers(0, 10, STEPS * size * PER_RANK).astype(np.int64)
mine = np.concatenate([np.arange(PER_RANK) + k * size * PER_RANK + rank * PER_RANK for k in range(STEPS)])
dataset = tf.data.Dataset.from_tensor_slices((images[mine], labels[mine])).repeat().batch(PER_RANK)


def mnist_model():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


model = mnist_model()
scaled_lr = 0.001 * size
opt = hvd.DistributedOptimizer(tf.optimizers.Adam(scaled_lr), backward_passes_per_step=1,
                               average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
              experimental_run_tf_function=False)
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)  # builds model and optimizer

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    tf.keras.backend.set_value(state.model.optimizer.lr, 0.001 * hvd.size())


state.register_reset_callbacks([on_state_reset])
callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
]
epochs_ended = []
callbacks.append(tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: epochs_ended.append(state.epoch)))
# Ranks other than 0 start the run apart: its first sync gives them rank 0's model.
model.layers[-1].bias.assign_add(tf.fill([10], float(rank)))


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch, callbacks=callbacks,
                    verbose=1 if rank == 0 else 0)


train(state)
assert (state.epoch, state.batch) == (EPOCHS, 0), (state.epoch, state.batch)
assert epochs_ended == list(range(1, EPOCHS + 1)), epochs_ended
# CommitStateCallback: after every 2 batches and at each epoch's end, counting afresh each epoch.
assert state.commit_number == EPOCHS * (STEPS // 2 + 1), state.commit_number

reference = mnist_model()
reference_opt = tf.keras.optimizers.Adam(scaled_lr)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
whole = [(images[rows], labels[rows]) for rows in (slice(k * size * PER_RANK, (k + 1) * size * PER_RANK)
                                                 for k in range(STEPS))]
for x, y in [whole[0]] + whole * EPOCHS:  # the step that built the model, then the epochs
    with tf.GradientTape() as tape:
        loss = loss_fn(y, reference(x, training=True))
    reference_opt.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                      reference.trainable_variables))
trained = [w.copy() for w in model.get_weights()]
for a, b in zip(trained, reference.get_weights()):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
np.testing.assert_allclose(opt.iterations.numpy(), 1 + STEPS * EPOCHS)

# The last commit was at the end of the last epoch: restore() rolls changes back to it.
model.layers[-1].bias.assign_add(tf.ones([10]))
opt.iterations.assign(0)
state.restore()
for a, b in zip(model.get_weights(), trained):
    np.testing.assert_array_equal(a, b)
assert opt.iterations.numpy() == 1 + STEPS * EPOCHS
# sync() gives every rank rank 0's values.
model.layers[-1].bias.assign_add(tf.fill([10], float(rank)))
state.sync()
biases = hvd.allgather_object(model.layers[-1].bias.numpy().tolist())
assert all(b == biases[0] for b in biases), biases
print(f"keras2_elastic program ok on rank {rank}", flush=True)
