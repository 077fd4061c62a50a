"""Prints 'RANK <rank> OF <size>' from MPI's world communicator, with mpi4py alone (no hvdplus).
tests/test_runner.py runs it under hvdplusrun to see every rank start where it was placed."""

from mpi4py import MPI

print(f"RANK {MPI.COMM_WORLD.Get_rank()} OF {MPI.COMM_WORLD.Get_size()}", flush=True)
