"""The contiguous split of a sequence of costs whose costliest part is cheapest.

A pipeline runs at the pace of its slowest stage, and each stage is a run of consecutive
layers: given each layer's cost (seconds, or parameters for memory), `balanced_counts` picks
how many layers each stage takes so that the largest stage total is as small as it can be.
"""

from typing import List, Sequence

__all__ = ["balanced_counts"]


def balanced_counts(costs: Sequence[float], parts: int) -> List[int]:
    """Layer counts, one per part, each at least 1 and summing to len(costs), whose costliest
    part (the sum of its layers' costs) is the least any contiguous split allows. Of equally
    good splits, the one with the earliest cuts: the same on every rank given the same costs."""
    layers = len(costs)
    if parts < 1 or parts > layers:
        raise ValueError(f"balanced_counts: cannot split {layers} layers into {parts} non-empty parts")
    if min(costs, default=0) < 0:
        raise ValueError(f"balanced_counts: costs must not be negative, got {list(costs)}")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + float(cost))
    # best[p][n]: the least costliest part over splits of the first n layers into p parts;
    # cut[p][n]: where the last of those p parts starts in such a split.
    infinity = float("inf")
    best = [[infinity] * (layers + 1) for _ in range(parts + 1)]
    cut = [[0] * (layers + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for n in range(p, layers - (parts - p) + 1):
            for start in range(p - 1, n):
                worst = max(best[p - 1][start], prefix[n] - prefix[start])
                if worst < best[p][n]:  # strictly: the earliest start wins a tie
                    best[p][n], cut[p][n] = worst, start
    counts, end = [], layers
    for p in range(parts, 0, -1):
        start = cut[p][end]
        counts.append(end - start)
        end = start
    return counts[::-1]
