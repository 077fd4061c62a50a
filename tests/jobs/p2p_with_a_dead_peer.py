"""For tests/test_mpi_suites.py: rank 2 of a 3-rank elastic job kills itself after a
barrier while rank 0 receives from it and rank 1 sends to it; each survivor prints the
RanksFailedError it gets instead of hanging."""

import os
import signal

import numpy as np

import hvdplus as hvd

hvd.init()
hvd.barrier()
if hvd.rank() == 2:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    if hvd.rank() == 0:
        hvd.recv(3, 2)
    else:
        hvd.send(np.zeros(3, np.float32), 2)
except hvd.RanksFailedError as error:
    print(f"rank {hvd.rank()}: {error}", flush=True)
os._exit(0)  # a clean shutdown would wait on the dead rank
