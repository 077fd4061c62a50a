"""ZeroRedundancyOptimizer (ZeRO stages 1 and 2) on real ranks: the in-rank suite
tests/mpi/test_torch_zero.py at 2, 3 and 4 ranks (six parameters that no number of ranks shares
evenly), and a checkpoint saved by a job of 4 ranks that jobs of 2 and of 3 load and train on
from, as if never stopped (tests/mpi/test_torch_zero_resize.py). A failure names the test, the
rank and the assertion."""

import pytest

pytestmark = pytest.mark.mpi

SUITE = "tests/mpi/test_torch_zero.py"
RESIZE_SUITE = "tests/mpi/test_torch_zero_resize.py"


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
