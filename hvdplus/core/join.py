"""Join: ranks whose data runs out at different steps, and what must happen once all of
them are out.

`join()` (core.collectives) declares that this rank has no more data; until every rank has,
it takes part in the other ranks' joinable collectives with what each kind's spec contributes
for it (zeros, for the reductions), so they complete. That part needs nothing from the user.

What does need something is the state the ranks then hold: a rank that joined early stopped
updating its model while the others went on. A `Joinable` (an optimizer, for example) says
what to do about it through its `JoinHook`, which `Join` calls on every rank once the last
rank has joined, with that rank's number:

    with hvd.Join([optimizer]):
        for batch in this_ranks_batches:      # as many as this rank has
            ...
    # every rank now holds the last rank's parameters and optimizer state

`Join` calls `join()` as its block ends (also when the block raises, so that the other ranks
do not wait for this one), then each hook's `post_hook(last_rank)` in the order given.
"""

from typing import Iterable, List, Optional

from . import collectives

__all__ = ["JoinHook", "Joinable", "Join"]


class JoinHook:
    """What a Joinable does once every rank has joined. The default does nothing."""

    def post_hook(self, last_rank: int) -> None:
        """Called on every rank after all have joined; `last_rank` is the job rank that
        joined last, which took the most steps."""


class Joinable:
    """A participant in `Join`: anything with `join_hook()`, such as hvdplus.torch's
    DistributedOptimizer. This class documents the protocol; an object need not inherit it."""

    def join_hook(self) -> JoinHook:
        raise NotImplementedError


class Join:
    """Context manager for ranks with uneven data: joins as the block ends, then runs the
    joinables' hooks.

    Args:
        joinables: objects with `join_hook()`; their hooks run in this order.
        process_set: the set whose ranks join (None: the job).

    Attributes:
        last_rank: after the block, the job rank that joined last.
    """

    def __init__(self, joinables: Iterable = (), process_set=None):
        hooks = []
        for joinable in joinables:
            if not callable(getattr(joinable, "join_hook", None)):
                raise TypeError(f"Join: {type(joinable).__name__} has no join_hook(); see hvdplus.core.join")
            hooks.append(joinable.join_hook())
        self._hooks: List[JoinHook] = hooks
        self._process_set = process_set
        self.last_rank: Optional[int] = None

    def __enter__(self) -> "Join":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.last_rank = collectives.join(self._process_set)
        if exc_type is None:
            for hook in self._hooks:
                hook.post_hook(self.last_rank)
        return False
