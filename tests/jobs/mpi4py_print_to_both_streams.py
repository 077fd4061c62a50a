"""Prints 'hello from <rank>' on stdout and 'warning from <rank>' on stderr; mpi4py alone (no
hvdplus). tests/test_runner.py checks that --output-filename gives each rank's lines a file."""

import sys

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
print(f"hello from {rank}")
print(f"warning from {rank}", file=sys.stderr)
