"""ZeroRedundancyOptimizer (ZeRO stages 1 and 2) on real ranks: the in-rank suite
tests/mpi/test_torch_zero.py at 2, 3 and 4 ranks (six parameters that no number of ranks shares
evenly), and a checkpoint saved by a job of 4 ranks that jobs of 2 and of 3 load and train on
from, as if never stopped (tests/mpi/test_torch_zero_resize.py). A failure names the test, the
rank and the assertion."""

import os
import sys

import pytest

from elastic_jobs import replay

pytestmark = pytest.mark.mpi

SUITE = "tests/mpi/test_torch_zero.py"
RESIZE_SUITE = "tests/mpi/test_torch_zero_resize.py"
ELASTIC_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_jobs", "torch_train.py")


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_zero_on_ranks(mpi_job, nranks):
    mpi_job.run_pytest_on_ranks(nranks, [SUITE], timeout=420)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_of_four_ranks_goes_on_at_two_and_at_three(mpi_job, tmp_path):
    env = {"HVDPLUS_ZERO_CHECKPOINT_DIR": str(tmp_path)}
    mpi_job.run_pytest_on_ranks(4, [RESIZE_SUITE], env=env, timeout=180, pytest_args=("-k", "save"))
    assert (tmp_path / "full.pt").exists() and (tmp_path / "shard.3.pt").exists()
    for nranks in (2, 3):
        mpi_job.run_pytest_on_ranks(nranks, [RESIZE_SUITE], env=env, timeout=180,
                                    pytest_args=("-k", "not save"))


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("stage, mode", [(2, "in-place"), (1, "restart")])
def test_an_elastic_job_of_three_that_loses_a_rank_goes_on_at_two_as_the_replay(mpi_job, tmp_path, stage, mode):
    # The model's two parameters leave rank 2 of 3 owning none; rank 1, which dies at step 5,
    # owns the bias, whose momentum only the commit still holds.
    out = str(tmp_path / "result.json")
    launcher_args = ["--min-np", "1"] if mode == "in-place" else ["--min-np", "2", "--no-in-place"]
    result = mpi_job(3, [sys.executable, ELASTIC_JOB, out, "--zero", str(stage), "--kill", "1:5:step"],
                     launcher_args=launcher_args, timeout=150)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    trained = replay.load(out)
    sizes = replay.sizes(trained)
    assert sizes[:5] == [3] * 5 and set(sizes[5:]) == {2}, sizes
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)  # SGD with momentum replayed in numpy over the committed steps
