"""The training regimes beyond synchronous data parallelism (local SGD, PeriodicModelAverager,
DiLoCo, DistributedOptimizer(staleness=1)) on real ranks, each against a numpy replay of its
algorithm: the in-rank suite tests/mpi/test_torch_regimes.py, at 2 and 3 ranks. A failure names
the test, the rank and the assertion."""

import pytest

pytestmark = pytest.mark.mpi

SUITE = "tests/mpi/test_torch_regimes.py"


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("nranks", [2, 3])
def test_torch_regimes_on_ranks(mpi_job, nranks):
    mpi_job.run_pytest_on_ranks(nranks, [SUITE], timeout=360)
