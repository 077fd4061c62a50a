"""Rank 0's side of negotiation: which named operations every rank has submitted.

Ranks submit operations in whatever order their program produces them. The coordinator
collects each rank's requests, and once a name has been submitted by every rank that has
not joined, checks that all of them agree and releases it. Released names go out to every
rank as one list of `Batch`es, executed in that order everywhere, so the collectives pair
up across ranks. Compatible all-reduces are fused into one batch.

The response cache: once a name has been agreed, every rank may send the small integer id
the coordinator assigned to it instead of the whole request, and a name whose requests all
came as ids skips the check; steady-state training steps repeat the same names.

Released on demand: where the engine must not overlap compute (see
`settings.overlaps_compute`), ready names are held until some rank is waiting for a result
(a rank reports Token.WAITING and Token.NOT_WAITING as its callers start and stop waiting),
and then all of them go out together, fused as far as the threshold allows.
"""

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ..common.errors import error_to_wire
from .fusion import fused_nbytes, fusion_key
from .kinds import spec_of
from .protocol import Batch, Collective, Outcome, Request, Token
from .agreement import check_agreement

__all__ = ["Coordinator", "Stall"]

# Compared per item and per name: a module name is cheaper than an enum member looked up on
# its class, which costs a descriptor call on Python 3.11.
_ALLREDUCE = Collective.ALLREDUCE
_WAITING, _NOT_WAITING, _JOIN, _SHUTDOWN = Token.WAITING, Token.NOT_WAITING, Token.JOIN, Token.SHUTDOWN


@dataclasses.dataclass
class _Pending:
    by_rank: Dict[int, Request] = dataclasses.field(default_factory=dict)
    first_seen: float = 0.0
    needs_check: bool = False


@dataclasses.dataclass(frozen=True)
class Stall:
    """A pending name that some ranks submitted and others have not (yet).

    Args:
        name, kind: the collective.
        submitted: the ranks that submitted it.
        missing: the ranks, joined ones aside, that have not.
        since: the coordinator's clock when the first rank submitted it.
        age: seconds since then.
    """

    name: str
    kind: Collective
    submitted: List[int]
    missing: List[int]
    since: float
    age: float


class Coordinator:
    """Collects requests from all `size` ranks and hands out batches ready to execute."""

    def __init__(self, size: int, fusion_threshold: int, cache_capacity: int, clock=time.monotonic,
                 release_on_demand: bool = False):
        self.size = size
        self.release_on_demand = release_on_demand
        # Ranks with a caller waiting now; `_asked` also remembers a wait that began and ended
        # between two take_batches calls (a poll), so that it still releases what is ready.
        self.waiting: set = set()
        self._asked = False
        self.fusion_threshold = fusion_threshold
        self.cache_capacity = cache_capacity
        self.clock = clock
        self.pending: Dict[str, _Pending] = {}
        self.joined: List[int] = []
        self.shutdown_ranks: set = set()
        self._cached: List[Tuple[str, List[Optional[Request]]]] = []
        self._cache_id_of: Dict[str, int] = {}
        self._control: List[Batch] = []

    # -- input ------------------------------------------------------------------------
    def add(self, rank: int, items: Sequence) -> None:
        """Take rank `rank`'s new items: Requests, cache ids (int) and Tokens."""
        for item in items:
            if isinstance(item, int):
                name, by_rank = self._cached[item]
                self._pend(rank, by_rank[rank], checked=True)
            elif isinstance(item, Request):
                self._pend(rank, item, checked=False)
            elif item is _WAITING:
                self.mark_waiting(rank)
            elif item is _NOT_WAITING:
                self.waiting.discard(rank)
            elif item is _JOIN:
                self.joined.append(rank)
            elif item is _SHUTDOWN:
                self.shutdown_ranks.add(rank)
            else:
                raise TypeError(f"rank {rank} sent the coordinator {item!r}")

    def mark_waiting(self, rank: int) -> None:
        """A caller on `rank` waits for a result (Token.WAITING; rank 0 says so directly)."""
        self.waiting.add(rank)
        self._asked = True

    def _pend(self, rank: int, request: Request, checked: bool) -> None:
        entry = self.pending.get(request.name)
        if entry is None:
            entry = self.pending[request.name] = _Pending(first_seen=self.clock())
        entry.by_rank[rank] = request
        entry.needs_check = entry.needs_check or not checked

    # -- output -----------------------------------------------------------------------
    def take_batches(self) -> List[Batch]:
        """Everything that became ready since the last call, in execution order (when
        releasing on demand: only once some rank waits)."""
        if self.release_on_demand and not (self.waiting or self._asked):
            return []
        self._asked = False
        ready = [name for name, entry in self.pending.items() if self._is_ready(entry)]
        batches = self._batch(ready)
        if len(self.joined) == self.size:
            batches.append(Batch(Outcome.JOIN_DONE, value=self.joined[-1]))
            self.joined = []
        return batches

    def _is_ready(self, entry: _Pending) -> bool:
        return len(entry.by_rank) + sum(1 for r in self.joined if r not in entry.by_rank) >= self.size

    def _batch(self, ready: List[str]) -> List[Batch]:
        batches: List[Batch] = []
        open_fusions: Dict[tuple, list] = {}
        for name in ready:
            entry = self.pending.pop(name)
            ranks = sorted(entry.by_rank)
            requests = [entry.by_rank[r] for r in ranks]
            error = self._check(name, entry, ranks, requests)
            kind = requests[0].kind
            if error is not None:
                batches.append(Batch(kind, [name], error=error))
                continue
            cache_ids = self._remember(name, entry, ranks)
            spec = spec_of(kind)
            if spec.fused:
                known = None if entry.needs_check or len(ranks) != self.size else self._cache_id_of[name]
                self._fuse(name, requests[0], cache_ids, known, open_fusions, batches)
                continue
            batch = Batch(kind, [name], requests=[requests[0]], cache_ids=cache_ids)
            if spec.per_rank is not None:  # such kinds are not joinable: every rank sent a request
                batch.per_rank = [spec.per_rank(entry.by_rank[r]) for r in range(self.size)]
            batches.append(batch)
        return batches

    def _check(self, name, entry, ranks, requests):
        absent = [r for r in range(self.size) if r not in entry.by_rank]
        kind = requests[0].kind
        if absent:
            spec = spec_of(kind)
            if not spec.joinable:
                # Horovod's words too, which programs written for Horovod may look for.
                horovod = f" (Horovod: {spec.not_with_join})" if spec.not_with_join else ""
                return ("HvdplusError", f"{kind} '{name}' cannot run while ranks {absent} have joined{horovod}")
        if not entry.needs_check:
            return None
        try:
            check_agreement(requests, ranks)
        except (TypeError, ValueError, RuntimeError) as exc:
            return error_to_wire(exc)
        return None

    def _remember(self, name, entry, ranks) -> Optional[Dict[str, int]]:
        """Give `name` a cache id (or refresh its requests); returned to ship to the ranks."""
        if not entry.needs_check or len(ranks) != self.size:
            return None
        by_rank = [entry.by_rank[r] for r in range(self.size)]
        cache_id = self._cache_id_of.get(name)
        if cache_id is None:
            if len(self._cached) >= self.cache_capacity:
                return None
            cache_id = self._cache_id_of[name] = len(self._cached)
            self._cached.append((name, by_rank))
        else:
            self._cached[cache_id] = (name, by_rank)
        return {name: cache_id}

    def _fuse(self, name, request, cache_ids, known_id, open_fusions, batches) -> None:
        """Append `name` to the open fused batch of its kind, or open a new one. `known_id`
        is its cache id when every rank sent that id, else None."""
        key = fusion_key(request)
        nbytes = fused_nbytes(request)
        batch, used = open_fusions.get(key, (None, 0))
        if batch is None or used + nbytes > self.fusion_threshold:
            batch, used = Batch(_ALLREDUCE, requests=[], cache_ids={}, known_ids=[]), 0
            batches.append(batch)
        open_fusions[key] = (batch, used + nbytes)
        batch.names.append(name)
        batch.requests.append(request)
        batch.cache_ids.update(cache_ids or {})
        if known_id is None:
            batch.known_ids = None
        elif batch.known_ids is not None:
            batch.known_ids.append(known_id)

    # -- stalls -----------------------------------------------------------------------
    def stalled(self, older_than: float) -> List[Stall]:
        """The pending names first submitted at least `older_than` seconds ago."""
        now = self.clock()
        found = []
        for name, entry in self.pending.items():
            age = now - entry.first_seen
            if age >= older_than:
                missing = [r for r in range(self.size) if r not in entry.by_rank and r not in self.joined]
                kind = next(iter(entry.by_rank.values())).kind
                found.append(Stall(name, kind, sorted(entry.by_rank), missing, entry.first_seen, age))
        return found

    def submitted_by(self, rank: int) -> List[Tuple[Collective, str]]:
        """(kind, name) of each pending name that `rank` has submitted, oldest first."""
        return [(entry.by_rank[rank].kind, name) for name, entry in self.pending.items() if rank in entry.by_rank]
