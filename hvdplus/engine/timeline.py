"""A Chrome-trace timeline of every tensor's life, for chrome://tracing and Perfetto.

Rank 0 writes one row per collective, named `<kind>.<name>` as Horovod's rows are
(`allreduce.grad_3`; a name that already starts with its kind, like an unnamed call's
`allreduce.7`, is kept as it is), with its phases: NEGOTIATE_<KIND> (first rank submitted it
until every rank had), MEMCPY_IN_FUSION_BUFFER, the collective itself (<KIND>), and
MEMCPY_OUT_FUSION_BUFFER. With `mark_cycles`, each engine cycle that runs collectives starts
with a CYCLE_START instant event. Counters (a LoadBalancer's per-rank compute time per step
and local batch sizes) are counter tracks, one series per rank. Events are appended and flushed as they happen, so a job
killed midway leaves a readable trace (both viewers accept an unterminated event array);
`close()` terminates the array, making the file strict JSON.
"""

import json
import threading
import time

__all__ = ["Timeline", "KindRows", "now_us", "record_negotiation", "row_name"]


def now_us() -> float:
    return time.perf_counter_ns() / 1000.0


def row_name(kind: str, name: str) -> str:
    """The row of collective `name` of `kind`: `<kind>.<name>`."""
    prefix = f"{kind}."
    return name if name.startswith(prefix) else prefix + name


class Timeline:
    """Rank 0's trace file.

    Args:
        path: where to write it.
        mark_cycles: write a CYCLE_START event at each `mark_cycle_start()`.
    """

    def __init__(self, path: str, mark_cycles: bool = False):
        self.path = path
        self.mark_cycles = mark_cycles
        self._file = open(path, "w", buffering=1)
        self._file.write("[\n")
        self._rows = {}
        self._lock = threading.Lock()
        self._write({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "hvdplus rank 0"}})

    def _write(self, event) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + ",\n")

    def _row(self, label: str) -> int:
        row = self._rows.get(label)
        if row is None:
            row = self._rows[label] = len(self._rows) + 1
            self._write({"name": "thread_name", "ph": "M", "pid": 0, "tid": row, "args": {"name": label}})
        return row

    def span(self, row: str, phase: str, start_us: float, end_us: float, **args) -> None:
        """Record that the collective of `row` (see row_name) was in `phase` from `start_us` to
        `end_us` (see now_us)."""
        with self._lock:
            if self._file.closed:
                return
            event = {"name": phase, "ph": "X", "pid": 0, "tid": self._row(row),
                     "ts": round(start_us, 3), "dur": round(max(end_us - start_us, 0.0), 3)}
            if args:
                event["args"] = args
            self._write(event)

    def of_kind(self, kind: str) -> "KindRows":
        """This timeline as a batch of `kind` writes it: by its collectives' bare names."""
        return KindRows(self, kind)

    def counter(self, name: str, values: dict) -> None:
        """A sample, now, of counter track `name`: one series per key of `values`."""
        with self._lock:
            if not self._file.closed:
                self._write({"name": name, "ph": "C", "pid": 0, "ts": round(now_us(), 3), "args": values})

    def mark_cycle_start(self) -> None:
        """A CYCLE_START instant event across the whole trace, when cycles are marked."""
        if not self.mark_cycles:
            return
        with self._lock:
            if not self._file.closed:
                self._write({"name": "CYCLE_START", "ph": "i", "pid": 0, "ts": round(now_us(), 3), "s": "g"})

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            end = {"name": "timeline_end", "ph": "i", "pid": 0, "ts": now_us(), "s": "g"}
            self._file.write(json.dumps(end) + "\n]\n")
            self._file.close()


class KindRows:
    """A timeline seen through one batch: `span` takes a collective's bare name and writes
    to its `<kind>.<name>` row, so the kinds' code names tensors as it always does."""

    def __init__(self, timeline: Timeline, kind: str):
        self._timeline, self._kind = timeline, kind

    def span(self, name: str, phase: str, start_us: float, end_us: float, **args) -> None:
        self._timeline.span(row_name(self._kind, name), phase, start_us, end_us, **args)


def record_negotiation(rows: KindRows, batch, entries) -> None:
    """Each entry's span from its submission until `batch` (which runs it) was agreed."""
    start = now_us()
    for entry in entries:
        if entry is not None:
            rows.span(entry.name, "NEGOTIATE_" + batch.kind.upper(), entry.submitted_us, start)
