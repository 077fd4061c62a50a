"""Each rank sets HVDPLUS_NODE_ID from its world rank's parity before hvd.init() reads the
settings, so even and odd ranks pose as two nodes that are not contiguous ranges; each prints
its local and cross rank and size. tests/test_runtime.py runs it on four ranks."""

import os

from mpi4py import MPI

import hvdplus as hvd

os.environ["HVDPLUS_NODE_ID"] = f"host-{MPI.COMM_WORLD.Get_rank() % 2}"
hvd.init()
print(f"rank {hvd.rank()} local {hvd.local_rank()}/{hvd.local_size()} cross {hvd.cross_rank()}/{hvd.cross_size()}")
