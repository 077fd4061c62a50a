"""Test layout: files directly under tests/ run in one process (plain `pytest`); files under
tests/mpi/ (and tests/mpi/keras/, once per Keras backend) run inside every rank of an MPI
job, which tests/test_mpi_suites.py starts with 1, 2 and 3 ranks and a timeout. They are
only collected when HVDPLUS_MPI_TESTS=1.

One-process tests that start ranks get the launcher from the `mpi_job` fixture and carry the
`mpi` marker, so `pytest -m "not mpi"` runs the rest in seconds; `slow` marks those that take
more than about 20 s."""

import os

import pytest

from testkit.mpi_jobs import MpiJob

collect_ignore = [] if os.environ.get("HVDPLUS_MPI_TESTS") == "1" else ["mpi"]


@pytest.fixture(scope="session")
def mpi_job():
    """The job launcher (tests/testkit/mpi_jobs.py): `mpi_job(nranks, args, env=None, timeout=240)` runs
    `args` on `nranks` ranks under hvdplusrun and ends it at the timeout;
    `mpi_job.run_pytest_on_ranks(nranks, paths)` runs pytest in every rank."""
    return MpiJob()


def pytest_collection_modifyitems(items):
    # `-m "not mpi"` is only right while every test that starts jobs says so.
    unmarked = [item.nodeid for item in items
                if "mpi_job" in getattr(item, "fixturenames", ()) and item.get_closest_marker("mpi") is None]
    if unmarked:
        raise pytest.UsageError("tests that use the mpi_job fixture need the mpi marker: " + ", ".join(unmarked))
