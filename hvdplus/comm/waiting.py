"""Waiting for peers without taking the core they may need.

MPI_Wait and MPI_Barrier spin until they complete. Where ranks outnumber the cores they
run on (several per core, or containers sharing a machine), a rank that enters a collective
early and spins there takes the core from the peers it waits for, which are still preparing
their data: a large all-reduce then takes seconds instead of a fraction of one. Waiting
here, a rank looks at what it waits for with a `Backoff` between looks (yielding the core
for about a millisecond, as long as a fast peer takes, then sleeping ever longer), so that
a long wait leaves the core to whoever needs it. `arrive_together` is such a barrier: ranks
pass it before moving a large buffer, then move it with MPI's own (spinning) waits, which
keep the data flowing.
"""

from typing import Callable, Optional

from mpi4py import MPI

from ..common.backoff import Backoff

__all__ = ["wait_until", "wait", "arrive_together"]

# While sleeping, call the caller's check this often (in looks).
LOOKS_PER_CHECK = 16


def wait_until(done: Callable[[], bool], check: Optional[Callable[[], None]] = None) -> None:
    """Return once `done()` is true, looking again and again; `check()`, if given, runs now
    and then while sleeping (to notice a dead peer, which never arrives)."""
    if done():
        return
    backoff = Backoff()
    while not done():
        backoff.pause()
        if check is not None and backoff.sleeping and backoff.looks % LOOKS_PER_CHECK == 0:
            check()


def wait(request: MPI.Request) -> None:
    """MPI_Wait on `request`, without spinning (see the module's docstring)."""
    wait_until(request.Test)


def arrive_together(comm: MPI.Comm) -> None:
    """Return once every rank of `comm` has called this; wait without spinning.

    After a long wait each rank notices the others' arrival up to one sleep of its backoff
    apart, and the first to notice would spin in the data's MPI waits until the last does. A
    second barrier, which every rank enters as soon as it notices and waits for with a fresh
    (short-sleeping) backoff, brings them out within a small part of that. Callers pass it
    before moving a megabyte or more, beside which the second barrier's cost is small."""
    wait(comm.Ibarrier())
    wait(comm.Ibarrier())
