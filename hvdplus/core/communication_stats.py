"""Bytes handed to collectives by gradient reductions, before and after compression.

Each reduction counts the bytes of the tensor it reduces (before) and of every payload it
hands a collective (after), by compression and collective kind. These are this rank's
payloads, not the algorithm's traffic: a ring all-reduce sends about 2 (N-1)/N times its
payload, an allgather (N-1) times. DistributedOptimizer closes a step at each synchronize.
"""

import copy
import threading

__all__ = ["count_tensor", "count_payload", "end_step", "communication_stats", "reset_communication_stats"]

_lock = threading.Lock()
_total = {}
_step = {}
_last_step = {}
_steps = 0


def _entry(table, label):
    return table.setdefault(label, {"tensors": 0, "bytes_before": 0, "bytes_after": 0, "by_collective": {}})


def count_tensor(label: str, nbytes: int) -> None:
    """One tensor of `nbytes` reduced with the compression called `label`."""
    with _lock:
        for table in (_total, _step):
            entry = _entry(table, label)
            entry["tensors"] += 1
            entry["bytes_before"] += int(nbytes)


def count_payload(label: str, kind: str, nbytes: int) -> None:
    """A payload of `nbytes` handed to a collective of `kind` ("allreduce", "allgather")."""
    with _lock:
        for table in (_total, _step):
            entry = _entry(table, label)
            entry["bytes_after"] += int(nbytes)
            entry["by_collective"][kind] = entry["by_collective"].get(kind, 0) + int(nbytes)


def end_step() -> None:
    """Close the current step: its counts become `last_step`."""
    global _steps, _step, _last_step
    with _lock:
        if _step:
            _last_step, _step = _step, {}
            _steps += 1


def communication_stats() -> dict:
    """{"steps": steps closed, "total": {...}, "last_step": {...}}, where each maps a
    compression ("none", "fp16", "int8", "topk", "powersgd", ...) to its "tensors",
    "bytes_before", "bytes_after" and "by_collective" (bytes after, per collective kind)."""
    with _lock:
        return {"steps": _steps, "total": copy.deepcopy(_total), "last_step": copy.deepcopy(_last_step)}


def reset_communication_stats() -> None:
    """Start counting afresh."""
    global _steps, _total, _step, _last_step
    with _lock:
        _steps, _total, _step, _last_step = 0, {}, {}, {}
