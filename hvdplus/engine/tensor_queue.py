"""The operations submitted on one rank: those not yet sent to rank 0, and every one still
in flight, by name. Not locked itself: the engine calls it under its own lock, which also
guards what decides whether its thread may sleep (see Engine.submit and Engine._idle)."""

import collections
import dataclasses
from typing import Any, Deque, Dict, List, Optional

from .handles import Handle
from .protocol import Request
from .timeline import now_us

__all__ = ["Entry", "TensorQueue"]


@dataclasses.dataclass(eq=False)
class Entry:
    """One submitted operation on this rank: what every rank must agree on, and this rank's data."""

    request: Request
    payload: Any
    handle: Handle
    submitted_us: float = dataclasses.field(default_factory=now_us)

    @property
    def name(self) -> str:
        return self.request.name


class TensorQueue:
    """Submitted operations, in order, until sent; in flight, by name, until done."""

    def __init__(self, rank: int):
        self.rank = rank
        self._submitted: Deque[Entry] = collections.deque()
        self._in_flight: Dict[str, Entry] = {}

    def add(self, entry: Entry) -> None:
        """Queue `entry`; ValueError if its name is already in flight on this rank."""
        if entry.name in self._in_flight:
            raise ValueError(f"an operation named '{entry.name}' is already in flight on rank {self.rank}; "
                             "synchronize it before submitting the name again")
        self._in_flight[entry.name] = entry
        self._submitted.append(entry)

    def take_submitted(self) -> List[Entry]:
        """The entries submitted since the last call, in order."""
        entries = list(self._submitted)
        self._submitted.clear()
        return entries

    def has_submitted(self) -> bool:
        return bool(self._submitted)

    def get(self, name: str) -> Optional[Entry]:
        return self._in_flight.get(name)

    def pop(self, name: str) -> Optional[Entry]:
        return self._in_flight.pop(name, None)

    def take_all(self) -> List[Entry]:
        """Every entry in flight, which leaves the queue empty."""
        entries = list(self._in_flight.values())
        self._in_flight.clear()
        self._submitted.clear()
        return entries

    def __bool__(self) -> bool:
        return bool(self._in_flight)
