"""hvd.CrossDeviceOps under tf.distribute.MirroredStrategy, with Keras' model.fit: k processes
of d logical CPU devices each train to the same weights as one process with one device and
the k times larger batch. Each job is this file run as a script, because logical devices
must be configured before TensorFlow starts.

The comparison with one process is what catches a wrong cross-process scaling: a sum where
an average belongs gives gradients k times too large, and every process still agrees with
the others (the job trains that variant too, and the test checks that it is caught).
"""

import argparse
import contextlib
import importlib.util
import os
import sys

import numpy as np
import pytest

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow"),
]

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


def run_job(mpi_job, processes, devices, out):
    out.mkdir()
    command = [sys.executable, os.path.abspath(__file__), "--devices", str(devices), "--out", str(out)]
    result = mpi_job(processes, command, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150)
    assert result.returncode == 0, f"--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(processes)]


@pytest.fixture(scope="module")
def references(mpi_job, tmp_path_factory):
    return run_job(mpi_job, 1, 2, tmp_path_factory.mktemp("single") / "job")[0]


def assert_direct_calls(ranks, devices):
    """SUM: this process' replicas summed, then averaged over processes; MEAN: means averaged;
    broadcast: rank 0's value. On every device of every process."""
    processes = len(ranks)
    local_sums = [sum(10.0 * r + i + 1 for i in range(devices)) for r in range(processes)]
    expected = {"sum": np.mean(local_sums), "mean": np.mean(local_sums) / devices, "broadcast": 5.0}
    for weights in ranks:
        for name, value in expected.items():
            np.testing.assert_allclose(weights[f"direct_{name}"], np.full(devices, value))


def assert_trained_alike(ranks, name, reference):
    for weights in ranks:
        np.testing.assert_array_equal(weights[name], ranks[0][name])  # every process agrees to the bit
        np.testing.assert_allclose(weights[name], reference, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
def test_one_process_with_two_devices(references):
    assert_direct_calls([references], devices=2)
    assert_trained_alike([references], "mirrored_1x2", references["reference_1"])


@pytest.mark.timeout(200)
def test_two_processes_with_two_devices_each_and_the_scaling_trap(mpi_job, references, tmp_path):
    ranks = run_job(mpi_job, 2, 2, tmp_path / "job")
    assert_direct_calls(ranks, devices=2)
    assert_trained_alike(ranks, "mirrored_2x2", references["reference_2"])
    # A sum across processes (op=Sum) trains to weights all processes share, and wrong ones.
    assert np.array_equal(ranks[0]["summed_2x2"], ranks[1]["summed_2x2"])
    assert np.abs(ranks[0]["summed_2x2"] - references["reference_2"]).max() > 1e-2


@pytest.mark.timeout(200)
def test_two_processes_with_one_device_each(mpi_job, references, tmp_path):
    # The case in which TensorFlow skips cross-device ops it believes have one worker.
    ranks = run_job(mpi_job, 2, 1, tmp_path / "job")
    assert_direct_calls(ranks, devices=1)
    assert_trained_alike(ranks, "mirrored_2x1", references["reference_2"])
    assert_trained_alike(ranks, "eager_2x1", references["reference_2"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of a MirroredStrategy job")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    job(arguments.devices, arguments.out)
