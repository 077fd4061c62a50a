"""For tests/test_slurm.py: one all-reduce with mpi4py alone (no hvdplus, so that what it
checks is how the ranks were started); each rank adds arange(4) * (rank + 1) and prints a
JSON line with its rank, the job's size, its host and the sum it got."""

import json
import socket

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
total = np.empty(4)
comm.Allreduce(np.arange(4.0) * (comm.rank + 1), total, op=MPI.SUM)
print(json.dumps({"rank": comm.rank, "size": comm.size, "host": socket.gethostname(), "sum": total.tolist()}),
      flush=True)
