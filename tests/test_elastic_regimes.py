"""Elastic PyTorch jobs that train with local SGD or DiLoCo and lose a rank between two averaging
points: tests/elastic_jobs/torch_regimes.py under hvdplusrun's elastic mode, which commits only
where `optimizer.averaged`, checked against replay.replay_regime.

Each job starts at 3 ranks with period 4, and rank 1 dies before step 6 (local SGD averages after
steps 0, 4, 8, ...; DiLoCo after steps 3, 7, 11, ...). The survivors must go back to the last
averaging point, so that the steps the job keeps begin at 2 ranks there, and the final weights of
every rank must be the replay's of those steps: each rank stepping on its own batches and the
ranks averaging at the size of that step, the step count going on across the re-form. A job that
commits between averaging points resumes from one rank's model, which the replay refuses."""

import os
import sys

import pytest

from elastic_jobs import replay

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(200)]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_jobs", "torch_regimes.py")
PERIOD, KILLED_AT = 4, 6
# The first step of the steps kept at 2 ranks: the one after the last averaging before step 6.
RESUMES_AT = {"local_sgd": 5, "diloco": 4}


def run_regime_job(mpi_job, tmp_path, regime, *job_args):
    out = str(tmp_path / "result.json")
    result = mpi_job(3, [sys.executable, SCRIPT, out, "--regime", regime, "--period", str(PERIOD),
                         "--kill", f"1:{KILLED_AT}:step", *job_args], launcher_args=["--min-np", "1"], timeout=150)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    assert "ranks [1] of 3 died; the other 2 re-formed the job" in output, output
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    return trained


@pytest.mark.parametrize("regime", ["local_sgd", "diloco"])
def test_a_rank_killed_between_averaging_points_resumes_from_the_last_average(mpi_job, tmp_path, regime):
    trained = run_regime_job(mpi_job, tmp_path, regime)
    resumed = RESUMES_AT[regime]
    assert replay.sizes(trained)[:resumed + 1] == [3] * resumed + [2], replay.sizes(trained)
    assert set(replay.sizes(trained)[resumed:]) == {2}, replay.sizes(trained)
    assert trained["resets"] == [2]
    # The optimizer's count went back with the commit and on from there: one per step kept.
    assert trained["optimizer_steps"] == len(trained["log"])
    replay.check_regime_weights(trained, regime, PERIOD)


def test_a_commit_between_averaging_points_is_told_apart(mpi_job, tmp_path):
    # The check above fails a job that resumes from a commit between averaging points: here
    # the job commits after every step (past TorchState.commit()'s refusal), so the survivors
    # go on from rank 0's own model after step 5.
    trained = run_regime_job(mpi_job, tmp_path, "local_sgd", "--commit-anywhere")
    assert replay.sizes(trained)[KILLED_AT - 1:KILLED_AT + 1] == [3, 2], replay.sizes(trained)
    with pytest.raises(AssertionError, match="from the state of 3 ranks whose parameters differ"):
        replay.check_regime_weights(trained, "local_sgd", PERIOD)
