"""A Chrome-trace timeline of every tensor's life, for chrome://tracing and Perfetto.

Rank 0 writes one row per tensor name with its phases: NEGOTIATE (first rank submitted it
until every rank had), QUEUE (agreed until its batch started), MEMCPY_IN_FUSION_BUFFER,
the collective itself, and MEMCPY_OUT_FUSION_BUFFER. Events are appended and flushed as
they happen, so a job killed midway leaves a readable trace (both viewers accept an
unterminated event array); `close()` terminates the array, making the file strict JSON.
"""

import json
import threading
import time

__all__ = ["Timeline", "now_us", "record_negotiation"]


def now_us() -> float:
    return time.perf_counter_ns() / 1000.0


class Timeline:
    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "w", buffering=1)
        self._file.write("[\n")
        self._rows = {}
        self._lock = threading.Lock()
        self._write({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "hvdplus rank 0"}})

    def _write(self, event) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + ",\n")

    def _row(self, tensor: str) -> int:
        row = self._rows.get(tensor)
        if row is None:
            row = self._rows[tensor] = len(self._rows) + 1
            self._write({"name": "thread_name", "ph": "M", "pid": 0, "tid": row, "args": {"name": tensor}})
        return row

    def span(self, tensor: str, phase: str, start_us: float, end_us: float, **args) -> None:
        """Record that `tensor` was in `phase` from `start_us` to `end_us` (see now_us)."""
        with self._lock:
            if self._file.closed:
                return
            event = {"name": phase, "ph": "X", "pid": 0, "tid": self._row(tensor),
                     "ts": round(start_us, 3), "dur": round(max(end_us - start_us, 0.0), 3)}
            if args:
                event["args"] = args
            self._write(event)

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            end = {"name": "timeline_end", "ph": "i", "pid": 0, "ts": now_us(), "s": "g"}
            self._file.write(json.dumps(end) + "\n]\n")
            self._file.close()


def record_negotiation(timeline, batch, entries) -> None:
    """Each entry's span from its submission until `batch` (which runs it) was agreed."""
    start = now_us()
    for entry in entries:
        if entry is not None:
            timeline.span(entry.name, "NEGOTIATE_" + batch.kind.upper(), entry.submitted_us, start)
