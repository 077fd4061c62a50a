"""hvd.CrossDeviceOps under tf.distribute.MirroredStrategy, with Keras' model.fit: k processes
of d logical CPU devices each train to the same weights as one process with one device and
the k times larger batch. Each job is tests/jobs/tf_mirrored_training.py, a process of its
own because logical devices must be configured before TensorFlow starts.

The comparison with one process is what catches a wrong cross-process scaling: a sum where
an average belongs gives gradients k times too large, and every process still agrees with
the others (the job trains that variant too, and the test checks that it is caught).
"""

import importlib.util

import numpy as np
import pytest

from testkit.programs import program

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow"),
]

def run_job(mpi_job, processes, devices, out):
    out.mkdir()
    command = program("tf_mirrored_training", "--devices", devices, "--out", out)
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
