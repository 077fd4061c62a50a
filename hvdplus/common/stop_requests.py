"""Stop requests: a signal that asks the job to stop where nothing is lost.

A scheduler warns a job before it ends it: Slurm sends `--signal=B:USR1@90` ahead of the
time limit, `scancel --signal=USR1` or a preemption SIGTERM. Inside `hvd.elastic.run`, such a
signal only marks this rank (`requested()`); the ranks then agree at the next `state.commit()`
(whose check every rank makes alike, in the same collective), so that every rank stops after
the same step, with that commit written, and none a step early or late.

The signals are HVDPLUS_STOP_SIGNALS (`--stop-signals`; SIGUSR1 and SIGTERM by default).
hvd.init() already marks the signals other than SIGTERM and SIGINT, so that a warning that
comes while the job starts is not lost. Signal handlers belong to the main thread: a program
that runs hvdplus in another thread catches none.
"""

import signal
import threading
import time
from typing import Any, Dict, Optional, Sequence

__all__ = ["install", "requested"]

_requested: Optional[str] = None
_requested_at: Optional[float] = None
_previous: Dict[int, Any] = {}


def _mark(signum, frame) -> None:
    global _requested, _requested_at
    name = signal.Signals(signum).name
    if _requested == name and signum in (signal.SIGTERM, signal.SIGINT):
        # Sent again: the sender will not wait for the next commit. Do what it did before.
        signal.signal(signum, _previous.pop(signum))
        signal.raise_signal(signum)
        return
    if _requested is None:
        _requested, _requested_at = name, time.monotonic()
    previous = _previous.get(signum)
    if callable(previous):  # a handler of the program's own still runs
        previous(signum, frame)


# Signals whose default ends a process that a program may well mean to end that way: they
# mark a stop only inside hvd.elastic.run, which then stops at its next commit.
_ENDING = (signal.SIGTERM, signal.SIGINT)


def install(names: Sequence[str], at_init: bool = False) -> None:
    """Mark this rank when one of the signals `names` ("SIGUSR1") arrives (once a process;
    the main thread only). `at_init`: from hvd.init(), before hvd.elastic.run, so that a
    warning that comes while the ranks start is kept (SIGTERM and SIGINT are left alone then)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in names:
        signum = getattr(signal, name)
        if signum in _previous or (at_init and signum in _ENDING):
            continue
        _previous[signum] = signal.signal(signum, _mark)


def requested() -> Optional[str]:
    """The signal that asked this rank to stop ("SIGUSR1"), or None."""
    return _requested


def seconds_since_request() -> Optional[float]:
    return None if _requested_at is None else time.monotonic() - _requested_at
