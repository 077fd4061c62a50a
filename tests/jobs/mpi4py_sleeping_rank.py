"""A rank to be ended: leaves an empty file named by its process id in the folder given,
prints 'started' and sleeps two minutes; mpi4py alone (no hvdplus). tests/test_runner.py
ends such jobs (SIGTERM to hvdplusrun, the mpi_job fixture's timeout) and checks, by those
process ids, that no rank is left running."""

import os
import sys
import time

from mpi4py import MPI  # noqa: F401 (a rank that starts MPI, as a training script's ranks do)

open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
print("started", flush=True)
time.sleep(120)
