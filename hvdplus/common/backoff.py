"""Pauses between looks at something a peer will do, cheap both ways.

A rank that waits for a peer looks again and again at whether the peer has arrived (an MPI
request, a counter in shared memory, an engine step). Looking without pause keeps a core
busy; where ranks outnumber cores, that core is taken from the very peer being waited for.
Sleeping a fixed slice between looks still costs a share of a core that grows with the
number of looks. So a `Backoff` does both in turn:

- first it only yields the core between looks, for about a millisecond: a wait that short
  (a fast peer) ends within microseconds of the peer's arrival;
- then it sleeps between looks, each sleep a fixed fraction of the time waited so far
  (`LATE_FRACTION`), between `MIN_SLEEP_S` and `MAX_SLEEP_S`. A wait of T seconds then
  ends at most that fraction of T late, and takes a number of looks that grows with the
  logarithm of T: a half-second wait costs about a hundred looks.
"""

import os
import time

__all__ = ["Backoff", "YIELD_S", "MIN_SLEEP_S", "MAX_SLEEP_S", "LATE_FRACTION"]

# Yield the core between looks this long, then sleep between them.
YIELD_S = 1e-3
# Each sleep is this fraction of the time waited so far (so a wait ends at most this much
# later than the event), within these bounds. The upper bound keeps a long wait's looks
# frequent enough to notice a dead peer or a shutdown within tens of milliseconds.
LATE_FRACTION = 1 / 16
MIN_SLEEP_S = 50e-6
MAX_SLEEP_S = 10e-3


class Backoff:
    """The pause before each next look of one wait; make one per wait.

    Args:
        yield_s: how long to only yield the core between looks before sleeping.
    """

    __slots__ = ("_started", "_yield_until", "_looks", "sleeping")

    def __init__(self, yield_s: float = YIELD_S):
        self._started = time.monotonic()
        self._yield_until = self._started + yield_s
        self._looks = 0
        self.sleeping = False

    def pause(self) -> None:
        """Pause before the next look: yield the core at first, later sleep."""
        self._looks += 1
        if not self.sleeping:
            os.sched_yield()
            # Read the clock now and then: it costs more than a yield.
            if self._looks % 64 == 0 and time.monotonic() >= self._yield_until:
                self.sleeping = True
            return
        time.sleep(self.next_sleep_s())

    def next_sleep_s(self) -> float:
        """How long the next sleep lasts, from the time waited so far."""
        waited = time.monotonic() - self._started
        return min(MAX_SLEEP_S, max(MIN_SLEEP_S, waited * LATE_FRACTION))

    @property
    def looks(self) -> int:
        return self._looks
