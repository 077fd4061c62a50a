"""The response cache: a name agreed once is sent again as a small id while its request is
unchanged, and rank 0 answers a batch of such names with their ids alone (Batch.known_ids).
Every rank learns each id with the batch that agreed it, so ids mean the same everywhere."""

from typing import Dict, Tuple

from .protocol import Batch, Collective, Request

__all__ = ["ResponseCache"]

_ALLREDUCE = Collective.ALLREDUCE


class ResponseCache:
    """This rank's agreed requests, by name and by cache id."""

    def __init__(self):
        self._by_name: Dict[str, Tuple[Request, int]] = {}
        self._by_id: Dict[int, Tuple[str, Request]] = {}

    def outgoing(self, request: Request):
        """`request` as sent to rank 0: its cache id when it is unchanged since agreed."""
        cached = self._by_name.get(request.name)
        if cached is not None and cached[0] == request:
            return cached[1]
        return request

    def remember(self, name: str, request: Request, cache_id: int) -> None:
        self._by_name[name] = (request, cache_id)
        self._by_id[cache_id] = (name, request)

    def batch(self, item) -> Batch:
        """A batch as rank 0 sent it: whole, or as the cache ids of its names, whose agreed
        requests this rank holds."""
        if isinstance(item, Batch):
            return item
        known = [self._by_id[cache_id] for cache_id in item]
        return Batch(_ALLREDUCE, [name for name, _ in known], requests=[request for _, request in known])
