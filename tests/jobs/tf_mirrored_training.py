"""One process of the MirroredStrategy jobs of tests/test_tf_mirrored_jobs.py: configures
--devices logical CPU devices, trains every variant this job's size has under
tf.distribute.MirroredStrategy with hvd.CrossDeviceOps (and, in a job of one, the
single-device references), calls CrossDeviceOps directly, and saves the results to
<--out>/rank<r>.npz for the test to compare. Logical devices must be configured before
TensorFlow starts, hence a process of its own.

    tf_mirrored_training.py --devices D --out FOLDER
"""

import argparse
import contextlib
import os

import numpy as np

STEPS, BATCH, TOKENS, VOCABULARY, EPOCHS = 3, 4, 4, 12, 2


def dataset(processes):
    """STEPS batches of processes * BATCH rows: token ids and a target."""
    rng = np.random.default_rng(3)
    rows = STEPS * processes * BATCH
    ids = rng.integers(0, VOCABULARY, size=(rows, TOKENS)).astype("int32")
    return ids, (rng.normal(size=(rows, 1)) + ids[:, :1] / VOCABULARY).astype("float32")


def shard(array, processes, rank):
    """This process' BATCH rows of every global batch, in step order."""
    return array.reshape(STEPS, processes, BATCH, *array.shape[1:])[:, rank].reshape(-1, *array.shape[1:])


def train(keras, seed, ids, targets, batch_size, strategy=None, before_fit=None, run_eagerly=False):
    """Weights after model.fit of an embedding (IndexedSlices gradients) and two dense layers."""
    keras.utils.set_random_seed(seed)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([
            keras.Input((TOKENS,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 3), keras.layers.Flatten(),
            keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", run_eagerly=run_eagerly)
    if before_fit:
        before_fit(model)
    model.fit(ids, targets, batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0)
    return np.concatenate([w.ravel() for w in model.get_weights()])


def job(devices, out):
    """One rank: configure `devices` logical CPUs, train every variant this job size has, save."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    import keras

    import hvdplus.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    logical = [device.name for device in tf.config.list_logical_devices("CPU")]
    results = {}

    def direct_calls():
        """CrossDeviceOps' reduce, batch_reduce and broadcast on a value that replica i of rank r
        holds as 10 r + i + 1: the results on each of this process' devices."""
        ops = hvd.CrossDeviceOps()
        strategy = tf.distribute.MirroredStrategy(logical, cross_device_ops=ops)
        value = strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(10.0 * rank + context.replica_id_in_sync_group + 1))
        (mean,) = ops.batch_reduce(tf.distribute.ReduceOp.MEAN, [(value, value)])
        reduced = {"sum": ops.reduce(tf.distribute.ReduceOp.SUM, value, destinations=value), "mean": mean,
                   "broadcast": ops.broadcast(tf.constant(rank + 5.0), destinations=value)}
        for name, result in reduced.items():
            results[f"direct_{name}"] = np.array([t.numpy() for t in strategy.experimental_local_results(result)])

    def mirrored(name, op=hvd.Average, run_eagerly=False):
        strategy = tf.distribute.MirroredStrategy(logical, cross_device_ops=hvd.CrossDeviceOps(op=op))
        ids, targets = dataset(size)
        # Each rank starts from its own random weights; rank 0's reach every rank.
        results[name] = train(keras, 100 + rank, shard(ids, size, rank), shard(targets, size, rank), BATCH,
                              strategy, lambda model: hvd.broadcast_variables(model.variables, root_rank=0),
                              run_eagerly)

    if size == 1:
        for processes in (1, 2):
            ids, targets = dataset(processes)
            results[f"reference_{processes}"] = train(keras, 100, ids, targets, processes * BATCH)
    direct_calls()
    mirrored(f"mirrored_{size}x{devices}")
    if size == 2 and devices == 2:
        mirrored("summed_2x2", op=hvd.Sum)
    if size == 2 and devices == 1:
        mirrored("eager_2x1", run_eagerly=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of a MirroredStrategy job")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    job(arguments.devices, arguments.out)
