"""The TensorFlow examples run on 2 ranks under the launcher: the digits CNN of the custom
training loop learns and only rank 0 prints and checkpoints; the MirroredStrategy example
(2 logical devices per process) learns and ends with the same weights on both processes."""

import importlib.util
import re
import sys

import pytest

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow"),
    pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn"),
]
# TensorFlow writes its start-up notices to every rank's stderr; the examples' own output is stdout.
TF_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def output_of(result):
    return f"--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"


def lines_of_rank(stdout, rank):
    # The launcher tags every line with its rank: "[1,0]<stdout>:" under Open MPI, "[0]" elsewhere.
    return re.findall(rf"^\[(?:\d+,)?{rank}\].*\S.*$", stdout, re.MULTILINE)


@pytest.mark.timeout(150)
def test_digits_custom_loop_learns_on_2_ranks_and_only_rank_0_logs_and_checkpoints(mpi_job, tmp_path):
    checkpoint = tmp_path / "digits.weights.h5"
    result = mpi_job(2, [sys.executable, "examples/tensorflow2_digits.py", "--checkpoint", str(checkpoint)],
                     env=TF_QUIET, timeout=120)
    assert result.returncode == 0, output_of(result)
    finals = re.findall(r"final test accuracy ([\d.]+)", result.stdout)
    assert len(finals) == 1 and float(finals[0]) > 0.9, output_of(result)
    metric_lines = [line for line in result.stdout.splitlines() if "test accuracy" in line]
    assert len(metric_lines) == 5 + 1, output_of(result)  # one per epoch, then the final line
    assert not lines_of_rank(result.stdout, 1), "rank 1 printed:\n" + output_of(result)
    assert checkpoint.stat().st_size > 0


@pytest.mark.timeout(150)
def test_mirrored_strategy_example_learns_and_keeps_processes_identical(mpi_job):
    result = mpi_job(2, [sys.executable, "examples/tensorflow2_mirrored.py", "--devices-per-process", "2",
                         "--epochs", "4"], env=TF_QUIET, timeout=120)
    assert result.returncode == 0, output_of(result)
    assert "processes 2  devices per process 2  replicas per step 4" in result.stdout, output_of(result)
    assert "weights identical on all 2 processes" in result.stdout, output_of(result)
    finals = re.findall(r"final test accuracy ([\d.]+)", result.stdout)
    assert len(finals) == 1 and float(finals[0]) > 0.85, output_of(result)
    assert not lines_of_rank(result.stdout, 1), "rank 1 printed:\n" + output_of(result)
