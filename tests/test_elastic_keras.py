"""Elastic Keras and TensorFlow jobs that lose a rank: tests/elastic_jobs/keras_train.py
(model.fit with hvdplus.keras.elastic's state and callbacks, on each Keras backend), checked
against tests/elastic_jobs/replay.py, and tests/elastic_jobs/tf_state.py (TensorFlowState
and TensorFlowKerasState, checked in the ranks).

Where the backend compiles the training step (TensorFlow, JAX), the dead rank's failure
surfaces inside it, wrapped by the backend; and the gradient_predivide_factor the jobs use
scales by the job's size, so a step that kept the old size would leave the replay."""

import os
import sys

import pytest

from elastic_jobs import replay

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "elastic_jobs")
STEPS_PER_EPOCH_AT_3 = 8  # 96 samples in batches of 4 per rank


def run_job(mpi_job, args, backend="torch"):
    result = mpi_job(3, [sys.executable, *args], env={"KERAS_BACKEND": backend},
                     launcher_args=["--min-np", "2"], timeout=240)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    return output


@pytest.mark.parametrize("backend, victim, step", [
    ("torch", 1, 5),                           # mid-epoch
    ("tensorflow", 0, 7),                      # rank 0, at the last batch of the first epoch
    ("jax", 2, STEPS_PER_EPOCH_AT_3),          # as the second epoch's fit begins
])
def test_fit_goes_on_without_a_killed_rank(mpi_job, tmp_path, backend, victim, step):
    out = str(tmp_path / "result.json")
    output = run_job(mpi_job, [os.path.join(JOBS, "keras_train.py"), out, "--kill", f"{victim}:{step}",
                               "--predivide", "2"], backend)
    assert f"ranks [{victim}] of 3 died; the other 2 re-formed the job" in output
    trained = replay.load(out)
    sizes = replay.sizes(trained)
    assert sizes[:step] == [3] * step and set(sizes[step:]) == {2}, sizes
    assert trained["size"] == 2
    assert (trained["epoch"], trained["batch"]) == (2, 0)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)


def test_tensorflow_states_commit_restore_and_sync(mpi_job):
    output = run_job(mpi_job, [os.path.join(JOBS, "tf_state.py"), "--kill", "1:3"], "tensorflow")
    sizes = [3, 3, 3, 2, 2, 2, 2, 2]
    for rank in range(2):
        assert f"rank {rank} ok, sizes {sizes}" in output, output
