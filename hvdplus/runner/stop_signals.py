"""SIGINT and SIGTERM to the launcher end the job, and it is never started again.

A signal means that a person (Ctrl-C) or a scheduler wants the job gone, whatever the
ranks were doing and whichever MPI runs them. While mpirun runs, `supervise` passes the
signal on to it and ends its session; at any other moment (before the first launch,
between two launches of an elastic job, while it waits for slots) the signal raises
`Stopped` where the launcher stands, which ends a host discovery script on its way out.
Either way the launcher exits with 128+N, as a shell reports a process ended by signal N,
once the job's processes are gone.
"""

import contextlib
import signal
import threading
from typing import Any, Dict, Iterator

__all__ = ["STOP_SIGNALS", "Stopped", "stopping_on_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


def replace_handlers(handler) -> Dict[int, Any]:
    """`handler` for the stop signals; the handlers it replaced, for `restore_handlers`. Signal
    handlers belong to the main thread: elsewhere (a driver's thread that starts a job) this
    installs nothing, and the caller's own thread handles nothing."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}


def restore_handlers(previous: Dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM raise `Stopped` (in the main thread); the handlers
    from before come back after it."""
    previous = replace_handlers(_raise_stopped)
    try:
        yield
    finally:
        restore_handlers(previous)
