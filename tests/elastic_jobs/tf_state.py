"""An elastic TensorFlow job for tests/test_elastic_keras.py: the commit, restore and sync of
hvdplus.tensorflow's TensorFlowState and TensorFlowKerasState, checked in every rank
against numpy; then a training loop of tf.function steps under hvdplus.tensorflow.elastic.run.

    tf_state.py [--kill RANK:STEP]

The loop adds the job's size, summed by an all-reduce inside tf.function, to a variable at
every committed step, so that its value is the sum of the sizes the log records. A rank
named by --kill dies (SIGKILL) as it begins committed step STEP; the survivors see the
failure inside the graph. Each rank prints "rank R ok" when every check passed.
"""

import argparse
import os
import signal

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdplus.keras  # noqa: E402
import hvdplus.tensorflow as hvd  # noqa: E402

STEPS = 8


def check_tensorflow_state():
    """Sync gives rank 0's variables and values; restore brings back the commit, copies."""
    rank = hvd.rank()
    v = tf.Variable(np.full(3, rank + 1.0))
    w = tf.Variable([[10.0 * rank]])
    state = hvd.elastic.TensorFlowState([v, w], epoch=rank, notes={"rank": rank})
    state.sync()
    np.testing.assert_array_equal(v.numpy(), np.ones(3))
    np.testing.assert_array_equal(w.numpy(), [[0.0]])
    assert (state.epoch, state.notes) == (0, {"rank": 0}), (state.epoch, state.notes)

    v.assign_add(np.arange(3.0))
    state.epoch = 1
    state.commit()
    for _ in range(2):  # the commit survives a restore: it is kept as a copy
        v.assign(np.full(3, 99.0))
        state.epoch, state.notes["rank"] = 5, 7
        state.restore()
        np.testing.assert_array_equal(v.numpy(), 1.0 + np.arange(3.0))
        assert (state.epoch, state.notes) == (1, {"rank": 0}), (state.epoch, state.notes)


def linear_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def check_tensorflow_keras_state():
    """Sync gives rank 0's weights, so one SGD step on every rank's own data lands where
    numpy puts it; a second step is undone by restore, optimizer variables included."""
    assert hvd.elastic.TensorFlowKerasState is hvdplus.keras.elastic.KerasState
    rank, size = hvd.rank(), hvd.size()
    model = linear_model(seed=rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    state = hvd.elastic.TensorFlowKerasState(model, epoch=0)
    assert state.optimizer is model.optimizer and model.optimizer.built
    kernel, bias = linear_model(seed=0).get_weights()
    state.sync()
    np.testing.assert_array_equal(model.get_weights()[0], kernel)

    data = [np.random.default_rng(r).standard_normal((4, 4)).astype("float32") for r in range(size)]
    model.fit(data[rank][:, :3], data[rank][:, 3:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    grads = [2 * d[:, :3].T @ (d[:, :3] @ kernel + bias - d[:, 3:]) / 4 for d in data]
    np.testing.assert_allclose(model.get_weights()[0], kernel - 0.1 * np.mean(grads, axis=0), rtol=1e-5)
    state.commit()
    committed = [v.numpy().copy() for v in model.weights + model.optimizer.variables]

    model.fit(data[rank][:, :3], data[rank][:, 3:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2
    state.restore()
    for variable, value in zip(model.weights + model.optimizer.variables, committed):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)
    assert int(model.optimizer.iterations.numpy()) == 1


@tf.function
def add_size(total):
    total.assign_add(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="size"))


def train_with_kills(kill):
    """Every committed step adds the size to `total` and logs it, until STEPS are done."""
    total = tf.Variable(0.0)
    state = hvd.elastic.TensorFlowState([total], sizes=[])
    launch_size = hvd.size()

    @hvd.elastic.run
    def train(state):
        while len(state.sizes) < STEPS:
            if kill == (hvd.rank(), len(state.sizes)) and hvd.size() == launch_size:
                os.kill(os.getpid(), signal.SIGKILL)
            add_size(total)
            state.sizes.append(hvd.size())
            state.commit()

    train(state)
    assert total.numpy() == sum(state.sizes), (total.numpy(), state.sizes)
    return state.sizes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", help="RANK:STEP")
    args = parser.parse_args()
    hvd.init()
    check_tensorflow_state()
    check_tensorflow_keras_state()
    sizes = train_with_kills(tuple(int(part) for part in args.kill.split(":")) if args.kill else None)
    print(f"rank {hvd.rank()} ok, sizes {sizes}", flush=True)


if __name__ == "__main__":
    main()
