"""The names hvdplus makes up for collectives nobody named (eagerly by call order, in graphs
when traced, a gradient's after its forward collective's) come out alike on every rank, whatever
else each rank does around them: tests/jobs/name_agreement.py, at 2 and 3 ranks, which also
holds TensorFlow's and torch's reducescatter gradients on a process set to numpy's and to each
other. A stall fails the job within seconds (HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS) rather than at
the timeout."""

import time

import pytest

from testkit import timing
from testkit.programs import program

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


def stall_after(seconds):
    return {"HVDPLUS_STALL_CHECK_TIME_SECONDS": "1", "HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS": str(seconds)}


@pytest.mark.slow
@pytest.mark.parametrize("nranks", [2, 3])
def test_made_up_names_agree_whatever_else_each_rank_does(mpi_job, nranks):
    result = mpi_job(nranks, program("name_agreement"), env=stall_after(30), timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    for rank in range(nranks):
        assert f"names agree on rank {rank}" in result.stdout


def test_a_name_that_differs_on_one_rank_stops_the_job_with_a_stall(mpi_job):
    # The check above is only worth something if it notices names that differ.
    started = time.monotonic()
    result = mpi_job(2, program("name_agreement", "--rounds", "2", "--misname-rank", "1"), env=stall_after(3),
                     timeout=150)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-8000:]
    assert "'misnamed_broadcast'" in output and "submitted by ranks [1], missing on ranks [0]" in output, output[-8000:]
    assert "StalledError" in output, output[-8000:]
    assert "names agree" not in result.stdout
    timing.assert_took_under(time.monotonic() - started, 120, quiet=29,
                             what="a job with a misnamed collective stalling out")
