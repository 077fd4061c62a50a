"""Compression.int8, .topk and .powersgd with error feedback on real ranks, each against a
numpy reference: the in-rank suite tests/mpi/test_torch_compression.py at 2 and 3 ranks (int8
allgathers its payloads there), and its int8 sums at 4 ranks, where they are all-reduced as
int16. A failure names the test, the rank and the assertion."""

import pytest

pytestmark = pytest.mark.mpi

SUITE = "tests/mpi/test_torch_compression.py"


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("nranks", [2, 3])
def test_torch_compression_on_ranks(mpi_job, nranks):
    mpi_job.run_pytest_on_ranks(nranks, [SUITE], timeout=360)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_int8_sums_on_four_ranks(mpi_job):
    mpi_job.run_pytest_on_ranks(4, [SUITE], timeout=240, pytest_args=["-k", "int8 or communication_stats"])
