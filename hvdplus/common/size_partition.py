"""Dealing items of known sizes over a number of owners so that each holds about as much:
how ZeroRedundancyOptimizer shares the parameters, and so their optimizer state, among ranks.

Greedy, largest first (as torch's ZeroRedundancyOptimizer does): each item in turn goes to
the owner that holds the least so far. It depends on nothing but the sizes, so every rank
computes the same partition on its own, with no message.
"""

from typing import List, Sequence

__all__ = ["partition_by_size", "owned_by"]


def partition_by_size(sizes: Sequence[int], owners: int) -> List[int]:
    """The owner (0 to `owners` - 1) of each item, in the items' order.

    Items are taken largest first (ties: the earlier item first), and each goes to the owner
    that holds the least so far (ties: the lowest owner), so the largest share exceeds the
    smallest by at most the largest item.

    Args:
        sizes: each item's size (bytes or elements), 0 or more.
        owners: how many owners share the items, 1 or more.
    """
    if owners < 1:
        raise ValueError(f"partition_by_size: owners must be at least 1, got {owners}")
    held = [0] * owners
    owner_of = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(owners), key=lambda o: (held[o], o))
        owner_of[index] = owner
        held[owner] += sizes[index]
    return owner_of


def owned_by(owner_of: Sequence[int], owner: int) -> List[int]:
    """The indices of the items that `owner` holds, in increasing order."""
    return [index for index, holder in enumerate(owner_of) if holder == owner]
