"""The Keras example under the launcher, on each installed backend."""

import importlib.util
import re
import sys

import pytest

pytest.importorskip("sklearn")
pytestmark = pytest.mark.mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax"])
def test_keras_digits_trains_on_two_ranks(mpi_job, backend, tmp_path):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec(backend) is None:
        pytest.skip(f"keras with the {backend} backend is not installed")
    checkpoint = tmp_path / "best.keras"
    result = mpi_job(2, [sys.executable, "examples/keras_digits.py", "--epochs", "6", "--checkpoint", str(checkpoint)],
                    env={"KERAS_BACKEND": backend}, timeout=280)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    finals = re.findall(r"final validation accuracy ([\d.]+) \(backend (\w+), 2 ranks", result.stdout)
    assert len(finals) == 1, result.stdout  # printed by rank 0 only
    accuracy, used = finals[0]
    assert used == backend and float(accuracy) > 0.85
    epochs = re.findall(r"\[1,(\d)\]<stdout>: Epoch \d+/6", result.stdout)
    assert epochs and set(epochs) == {"0"}, "progress must appear on rank 0 only"
    assert checkpoint.exists()
