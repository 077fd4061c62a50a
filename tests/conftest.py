"""Test layout: files directly under tests/ run in one process (plain `pytest`); files under
tests/mpi/ (and tests/mpi_keras/, once per Keras backend) run inside every rank of an MPI
job, which tests/test_mpi_suites.py starts with 1, 2 and 3 ranks and a timeout. They are
only collected when HVDPLUS_MPI_TESTS=1."""

import os

collect_ignore = [] if os.environ.get("HVDPLUS_MPI_TESTS") == "1" else ["mpi", "mpi_keras"]
