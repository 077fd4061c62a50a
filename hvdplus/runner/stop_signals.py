"""SIGINT and SIGTERM to the launcher end the job, and it is never started again.

A signal means that a person (Ctrl-C) or a scheduler wants the job gone, whatever the
ranks were doing and whichever MPI runs them. While mpirun runs, `supervise` passes the
signal on to it and ends its session; at any other moment (before the first launch,
between two launches of an elastic job, while it waits for slots) the signal raises
`Stopped` where the launcher stands, which ends a host discovery script on its way out.
Either way the launcher exits with 128+N, as a shell reports a process ended by signal N,
once the job's processes are gone.

SIGUSR1 and SIGUSR2 are passed on to mpirun, which passes them to every rank, and the job
goes on: a scheduler's warning (`sbatch --signal=B:USR1@90`, `scancel --signal=USR1 --batch`)
reaches the ranks, which stop at their next commit (hvdplus.common.stop_requests). Outside
a launch the launcher ignores them.
"""

import contextlib
import signal
import threading
from typing import Any, Dict, Iterator

__all__ = ["PASSED_ON_SIGNALS", "STOP_SIGNALS", "Stopped", "stopping_on_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class Stopped(Exception):
    """The launcher received `signum`: the job ends, with exit status 128+signum."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; every rank ended")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def replace_handlers(handler, signals=STOP_SIGNALS) -> Dict[int, Any]:
    """`handler` for `signals` (the stop signals); the handlers it replaced, for
    `restore_handlers`. Signal handlers belong to the main thread: elsewhere (a driver's
    thread that starts a job) this installs nothing, and the caller's own thread handles nothing."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in signals}


def restore_handlers(previous: Dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM raise `Stopped` (in the main thread); the handlers
    from before come back after it."""
    previous = {**replace_handlers(signal.SIG_IGN, PASSED_ON_SIGNALS), **replace_handlers(_raise_stopped)}
    try:
        yield
    finally:
        restore_handlers(previous)
