"""Imports hvdplus and prints whether that loaded mpi4py.MPI, which starts MPI.
tests/test_runtime.py checks that it prints False: importing hvdplus starts nothing."""

import sys

import hvdplus  # noqa: F401 (imported for what importing it loads)

print("mpi4py.MPI" in sys.modules)
