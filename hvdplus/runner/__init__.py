"""The `hvdplusrun` launcher: turns its flags into an mpirun command line and runs it.

Nothing here imports mpi4py.MPI at import time: the launcher is not an MPI process.
`launch` holds the command-line interface; the other modules each do one step
(`hosts`, `mpi_discovery`, `command`, `tuning`, `supervise`, `rank_output`, `check_build`).
"""

from .launch import main

__all__ = ["main"]
