"""Rank 0's watch for collectives that some ranks submitted and others have not.

A collective that has waited `check_after_s` for some ranks is reported once, and again each
time it has waited another `check_after_s`, never more often: a job that stalls for an hour
writes a page, not a screenful a second. Each report names the missing ranks and what each of
them did submit meanwhile, since a rank that took another path through the program shows
itself by a name the others never submit. Once a collective has waited `shutdown_after_s`, a
STALLED batch fails every rank's pending operations with StalledError rather than let the job
hang.
"""

import logging
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

from .negotiation import Stall
from .protocol import Batch, Outcome

__all__ = ["StallInspector"]

LOG = logging.getLogger("hvdplus")

# How often rank 0 looks at its pending names: a dict scan, cheap next to the check time.
_LOOK_EVERY_S = 0.25
# A stall of a whole training step holds every gradient; a report shows this many of each list.
_NAMES_SHOWN = 10


def _write_report(message: str) -> None:
    """To the "hvdplus" logger where the program configured logging, else to standard error
    (once: the logger's last-resort handler would write it again)."""
    if LOG.hasHandlers():
        LOG.warning(message)
        return
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class StallInspector:
    """Reports stalled collectives and, past the shutdown time, ends them.

    Args:
        check_after_s: how long a collective waits for some ranks before it is reported (0:
            never, and no shutdown either).
        shutdown_after_s: how long before a stall fails every rank's operations (0: never).
        clock: seconds, on the coordinator's clock.
        report: writes a report.
    """

    def __init__(self, check_after_s: float, shutdown_after_s: float, clock: Callable[[], float] = time.monotonic,
                 report: Callable[[str], None] = _write_report):
        self.check_after_s, self.shutdown_after_s = check_after_s, shutdown_after_s
        self._clock = clock
        self._report = report
        self._last_look = clock()
        self._ended = False  # a STALLED batch has gone out: the engine is finishing
        # Reports given per stalled collective, keyed by (name, since): a name submitted again
        # after it completed is a new stall.
        self._reports_given: Dict[Tuple[str, float], int] = {}

    def batches(self, coordinator) -> List[Batch]:
        """Report what in `coordinator` is due a report; a STALLED batch once a collective has
        waited `shutdown_after_s`."""
        if self.check_after_s <= 0 or self._ended:
            return []
        now = self._clock()
        if now - self._last_look < _LOOK_EVERY_S:
            return []
        self._last_look = now
        limit = self.shutdown_after_s
        stalls = coordinator.stalled(min(self.check_after_s, limit) if limit > 0 else self.check_after_s)
        ended = [stall for stall in stalls if limit > 0 and stall.age >= limit]
        if ended:
            # The shutdown's own report says it all: no warning beside it.
            message = (f"hvdplus ended the job's collectives after a stall of {limit:g} s "
                       f"(HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS):\n" + _describe_stalls(ended, coordinator))
            self._report(message)
            self._ended = True
            return [Batch(Outcome.STALLED, value=message)]
        due = self._due(stalls)
        if due:
            self._report(f"hvdplus: stalled collectives: ranks have waited {self.check_after_s:g} s or more for "
                         f"others to submit these (a name that differs between ranks never completes):\n"
                         + _describe_stalls(due, coordinator))
        return []

    def _due(self, stalls: Sequence[Stall]) -> List[Stall]:
        """The stalls that have waited another check time since their last report."""
        given, due = {}, []
        for stall in stalls:
            key = (stall.name, stall.since)
            owed, before = int(stall.age // self.check_after_s), self._reports_given.get(key, 0)
            given[key] = max(owed, before)
            if owed > before:
                due.append(stall)
        self._reports_given = given  # what is no longer stalled is forgotten
        return due


def _describe_stalls(stalls: Sequence[Stall], coordinator) -> str:
    """One line per stalled collective, then one per missing rank with what it submitted."""
    lines = [f"  {stall.kind} '{stall.name}' waited {stall.age:.0f} s: submitted by ranks {stall.submitted}, "
             f"missing on ranks {stall.missing}" for stall in stalls[:_NAMES_SHOWN]]
    if len(stalls) > _NAMES_SHOWN:
        lines.append(f"  and {len(stalls) - _NAMES_SHOWN} more")
    for rank in sorted({rank for stall in stalls for rank in stall.missing}):
        lines.append(f"  rank {rank} submitted meanwhile: {_listed(coordinator.submitted_by(rank))}")
    return "\n".join(lines)


def _listed(named: Sequence[Tuple[str, str]]) -> str:
    if not named:
        return "nothing yet"
    shown = ", ".join(f"{kind} '{name}'" for kind, name in named[:_NAMES_SHOWN])
    return shown + (f" and {len(named) - _NAMES_SHOWN} more" if len(named) > _NAMES_SHOWN else "")
