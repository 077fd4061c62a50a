"""hvd.init(comm=[0, 2]) in a job of three: world ranks 0 and 2 form hvdplus' job and
all-reduce their world ranks, world rank 1 is left out. Each prints what it became.
tests/test_runtime.py checks the ranks, the size and the sum each member saw."""

import numpy as np
from mpi4py import MPI

import hvdplus as hvd

hvd.init(comm=[0, 2])
world = MPI.COMM_WORLD.Get_rank()
if hvd.is_initialized():
    total = hvd.allreduce(np.array([world]), op=hvd.Sum)
    print(f"world {world} -> rank {hvd.rank()} of {hvd.size()} sum {total[0]}")
else:
    print(f"world {world} left out")
