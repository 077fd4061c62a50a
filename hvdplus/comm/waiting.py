"""Waiting for peers without taking the core they may need.

MPI_Wait and MPI_Barrier spin until they complete. Where ranks outnumber the cores they
run on (several per core, or containers sharing a machine), a rank that enters a collective
early and spins there takes the core from the peers it waits for, which are still preparing
their data: a large all-reduce then takes seconds instead of a fraction of one. Waiting
here, a rank looks at what it waits for, yielding the core between looks for about a
millisecond (as long as a fast peer takes), then sleeps briefly between looks, so that a
long wait leaves the core to whoever needs it. `arrive_together` is such a barrier: ranks
pass it before moving a large buffer, then move it with MPI's own (spinning) waits, which
keep the data flowing.
"""

import os
import time
from typing import Callable, Optional

from mpi4py import MPI

__all__ = ["wait_until", "wait", "arrive_together"]

# Yield the core between looks this long, then sleep between them.
YIELD_SECONDS = 1e-3
SLEEP_SECONDS = 50e-6
# While sleeping, call the caller's check this often (in looks).
LOOKS_PER_CHECK = 256


def wait_until(done: Callable[[], bool], check: Optional[Callable[[], None]] = None) -> None:
    """Return once `done()` is true, looking again and again; `check()`, if given, runs now
    and then while sleeping (to notice a dead peer, which never arrives)."""
    if done():
        return
    yield_until = time.monotonic() + YIELD_SECONDS
    looks, sleeping = 0, False
    while not done():
        looks += 1
        if not sleeping:
            os.sched_yield()
            sleeping = looks % 64 == 0 and time.monotonic() >= yield_until  # the clock, now and then
        else:
            time.sleep(SLEEP_SECONDS)
            if check is not None and looks % LOOKS_PER_CHECK == 0:
                check()


def wait(request: MPI.Request) -> None:
    """MPI_Wait on `request`, without spinning (see the module's docstring)."""
    wait_until(request.Test)


def arrive_together(comm: MPI.Comm) -> None:
    """Return once every rank of `comm` has called this; wait without spinning."""
    wait(comm.Ibarrier())
