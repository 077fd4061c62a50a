"""Rank 0's watch for names that some ranks submitted and others did not: a stall warns,
and past `stall_shutdown_seconds` it fails every rank's operations rather than let them wait
forever."""

import logging
import sys
import time
from typing import List

from .protocol import Batch, Outcome

__all__ = ["StallInspector"]

LOG = logging.getLogger("hvdplus")


class StallInspector:
    """Checks the coordinator's pending names at most once a second.

    Args:
        check_after_s: how long a name may wait for some ranks before it is reported (0:
            never).
        shutdown_after_s: how long before a stall fails the job's operations (0: never).
    """

    def __init__(self, check_after_s: float, shutdown_after_s: float):
        self.check_after_s, self.shutdown_after_s = check_after_s, shutdown_after_s
        self._last_check = time.monotonic()

    def batches(self, coordinator) -> List[Batch]:
        """Warn about the names stalled in `coordinator`; a STALLED batch when one has
        waited past `shutdown_after_s`."""
        now = time.monotonic()
        if self.check_after_s <= 0 or now - self._last_check < min(1.0, self.check_after_s):
            return []
        self._last_check = now
        stalled = coordinator.stalled(self.check_after_s)
        if not stalled:
            return []
        lines = [
            f"  '{name}' waited {age:.0f} s: submitted by ranks {submitted}, missing on ranks {missing}"
            for name, submitted, missing, age in stalled
        ]
        message = "hvdplus: stalled collectives (some ranks never submitted them):\n" + "\n".join(lines)
        LOG.warning(message)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        limit = self.shutdown_after_s
        if limit > 0 and any(age >= limit for *_, age in stalled):
            return [Batch(Outcome.STALLED, value=message + f"\nshutting down after {limit:.0f} s")]
        return []
