"""When the engine thread looks for work next. It never spins, so it leaves the cores to the
training loop: with nothing in flight it sleeps until something is submitted (looking around
once a second for shutdowns and stalls); with work in flight it cycles every
`cycle_time_ms`. Where the node has no core to spare for it (`overlap` off), agreed
collectives wait until some rank waits for one, submitting does not wake the thread, and its
cycle stretches to 50 ms while no caller waits: the data moves when the ranks' cores are free,
driven by the waiting callers themselves (see Engine.wait_for). While work is in flight but
nothing moves (a peer is late), the cycle stretches with the time nothing has moved, as a
`Backoff` (common.backoff) does: a late peer is noticed a small fraction of its lateness
later, and a long wait costs tens of cycles rather than one per millisecond."""

import time

__all__ = ["ProgressPolicy", "HOUSEKEEPING_S"]

# With nothing in flight (and overlap on), the thread still looks for shutdowns and stalls
# this often.
HOUSEKEEPING_S = 1.0
# Longest cycle while collectives are held and nobody waits (overlap off).
_MAX_BACKOFF_S = 0.050
# While nothing moves, the cycle is this fraction of the time nothing has moved, up to the
# bound. An engine step costs a few times a bare look at an MPI request (common.backoff), so
# the engine looks half as often as a Backoff does: a half-second wait then costs about fifty
# steps, under 3 % of a core, and a late peer is noticed at most an eighth of its lateness later.
_STILL_FRACTION = 1 / 8
_MAX_STILL_S = 0.020


class ProgressPolicy:
    """The engine thread's sleep between steps.

    Args:
        cycle_ms: the cycle while work is in flight (HVDPLUS_CYCLE_TIME).
        overlap: whether agreed collectives run in the background at once.
    """

    def __init__(self, cycle_ms: float, overlap: bool):
        self.overlap = overlap
        self.set_cycle(cycle_ms)

    def set_cycle(self, cycle_ms: float) -> None:
        self._cycle_s = self._backoff_s = cycle_ms / 1000.0
        self._still_since = time.monotonic()

    def note_step(self, moved: bool) -> None:
        """Whether the step just taken moved anything (see Engine._step)."""
        if moved:
            self._still_since = time.monotonic()

    def still_for_s(self) -> float:
        """How long no step has moved anything."""
        return time.monotonic() - self._still_since

    def wakes_on_submit(self) -> bool:
        """Whether a submission wakes an idle thread: only where it has a core of its own;
        otherwise waking it makes it fight the submitting thread for the GIL and the core."""
        return self.overlap

    def sleep_s(self, idle: bool, waiters: int) -> float:
        """How long to sleep before the next step, unless woken."""
        if idle:
            # Not woken by submit without overlap: look again as often as when held.
            self._backoff_s = self._cycle_s
            return HOUSEKEEPING_S if self.overlap else _MAX_BACKOFF_S
        if self.overlap or waiters:
            still_s = time.monotonic() - self._still_since
            return max(self._cycle_s, min(_MAX_STILL_S, still_s * _STILL_FRACTION))
        # Held until someone waits: look less and less often, sending what was submitted.
        sleep, self._backoff_s = self._backoff_s, min(2 * self._backoff_s, _MAX_BACKOFF_S)
        return sleep
