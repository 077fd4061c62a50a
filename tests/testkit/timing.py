"""Assertions on wall time that hold on a busy machine, each stating its margin.

A test that bounds how long something takes (a job ending after a rank fails, a timeout
firing) passes `quiet`, what a quiet machine measures, beside its `limit`: the limit must keep
at least MARGIN times the quiet figure, and a failure names both. With HVDPLUS_TEST_TIMINGS
naming a file, every measurement is appended to it as a JSON line (test, what, seconds,
limit, quiet), so a run beside a busy process (tests/load/beside_busy.sh) shows how close
each came to its limit, and a quiet run refreshes the quiet figures.
"""

import json
import os

__all__ = ["MARGIN", "assert_took_under"]

# The least ratio of a limit to what a quiet machine measures.
MARGIN = 2.0


def assert_took_under(seconds: float, limit: float, quiet: float, what: str) -> None:
    """`seconds` (measured) is under `limit`; `quiet` is what a quiet machine measures."""
    assert limit >= MARGIN * quiet, (
        f"the test's limit for {what} ({limit} s) keeps less than {MARGIN}x over a quiet machine's {quiet} s")
    _record(what, seconds, limit, quiet)
    assert seconds < limit, f"{what} took {seconds:.2f} s: over the limit of {limit} s (a quiet machine: {quiet} s)"


def _record(what: str, seconds: float, limit: float, quiet: float) -> None:
    path = os.environ.get("HVDPLUS_TEST_TIMINGS")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    with open(path, "a") as log:
        log.write(json.dumps({"test": test, "what": what, "seconds": round(seconds, 3), "limit": limit,
                              "quiet": quiet}) + "\n")
