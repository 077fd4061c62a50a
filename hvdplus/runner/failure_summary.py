"""The one summary that a failed job ends with, under hvdplusrun, horovodrun and hvdplus.run.

    hvdplusrun: the job failed (exit status 1); ranks 0 and 1 raised:
      rank 0 on host node1: KeyError: 'b', at train.py:4 (exit code 1)
      rank 1 on host node2: KeyError: 'b', at train.py:4 (exit code 1; reported first)
    hvdplusrun: traceback of ranks 0 and 1:
      Traceback (most recent call last):
        File "train.py", line 4, in <module>
      ...

The ranks report their failures in launcher messages (hvdplus.common.rank_errors), which a
`FailureReport` collects from mpirun's output while the job runs, in every launch of an elastic
job; `format_summary` writes them: one line per failed rank, then each traceback once, whole,
naming every rank that raised it.
"""

import threading
from typing import Dict, List, Mapping, Optional

from ..common.rank_errors import RankFailure

__all__ = ["FailureReport", "format_summary"]

# How much of an exception's message the line of its rank shows: its traceback shows it all.
_MESSAGE_CHARS = 200


class FailureReport:
    """The failures that the ranks of a job reported, as their messages arrive (from the
    launcher's output threads). A rank number reported again (by a later launch of an elastic
    job) holds its latest failure."""

    def __init__(self):
        self._lock = threading.Lock()
        self._failures: Dict[int, RankFailure] = {}  # in the order they were reported

    def take(self, message: dict) -> bool:
        """Collect `message` if it reports a failure; whether it did."""
        failure = RankFailure.from_message(message)
        if failure is None:
            return False
        with self._lock:
            self._failures.pop(failure.rank, None)
            self._failures[failure.rank] = failure
        return True

    def failures(self) -> List[RankFailure]:
        """Every failure reported, the first reported first."""
        with self._lock:
            return list(self._failures.values())

    def summary(self, status: int, prefix: str = "") -> str:
        """format_summary of every failure reported (there must be one)."""
        failures = self.failures()
        return format_summary({failure.rank: failure for failure in failures}, status, prefix, failures[0].rank)

    def raised(self) -> Dict[int, RankFailure]:
        """The failures that are exceptions, by rank, the first reported first."""
        return {failure.rank: failure for failure in self.failures() if failure.type}


def _ranks(ranks: List[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _what_failed(failures: List[RankFailure]) -> str:
    ranks = _ranks(sorted(failure.rank for failure in failures))
    if all(failure.type for failure in failures):
        return f"{ranks} raised"
    if not any(failure.type for failure in failures):
        return f"{ranks} exited with an error"
    return f"{ranks} failed"


def _rank_line(failure: RankFailure, first: bool) -> str:
    where = f"rank {failure.rank}" + (f" on host {failure.host}" if failure.host else "")
    lines = failure.message.splitlines() or [""]
    message = lines[0][:_MESSAGE_CHARS] + (" ..." if len(lines) > 1 or len(lines[0]) > _MESSAGE_CHARS else "")
    if failure.type:
        what = f"{failure.type}: {message}" if message else failure.type
        what += f", at {failure.file}:{failure.line}" if failure.file else ""
    else:
        what = f"exited with status {failure.exit_code}" + (f": {message}" if message else "")
    notes = [f"exit code {failure.exit_code}"] if failure.type and failure.exit_code is not None else []
    notes += ["reported first"] if first else []
    return f"  {where}: {what}" + (f" ({'; '.join(notes)})" if notes else "")


def format_summary(failures: Mapping[int, RankFailure], status: int, prefix: str = "",
                   first: Optional[int] = None) -> str:
    """The summary of the job's `failures` (by rank), which ended with exit `status`: each line
    that opens a part starts with `prefix` ("hvdplusrun: "); `first` marks the rank that
    reported first."""
    ordered = [failures[rank] for rank in sorted(failures)]
    lines = [f"{prefix}the job failed (exit status {status}); {_what_failed(ordered)}:"]
    lines += [_rank_line(failure, len(ordered) > 1 and failure.rank == first) for failure in ordered]
    by_traceback: Dict[str, List[int]] = {}  # identical tracebacks of several ranks are shown once
    for failure in ordered:
        if failure.traceback.strip():
            by_traceback.setdefault(failure.traceback.rstrip(), []).append(failure.rank)
    for traceback, ranks in by_traceback.items():
        lines.append(f"{prefix}traceback of {_ranks(ranks)}:")
        lines += ["  " + line for line in traceback.splitlines()]
    return "\n".join(lines)
