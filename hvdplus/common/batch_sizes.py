"""Local batch sizes in proportion to the ranks' speeds: the arithmetic of the load balancer.

Every rank runs these functions on the same gathered speeds and must reach the same sizes,
so they compute in exact rational arithmetic (a float speed is an exact fraction) and break
ties by rank: no rounding of a platform or a summation order can make two ranks disagree.
"""

import math
import statistics
from fractions import Fraction
from typing import List, Sequence, Tuple

__all__ = ["balanced_sizes", "moves_enough", "departures"]


def _checked_speeds(speeds: Sequence[float]) -> List[Fraction]:
    if len(speeds) == 0:
        raise ValueError("balanced_sizes needs the speed of at least one rank")
    exact = []
    for rank, speed in enumerate(speeds):
        speed = float(speed)
        if not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"balanced_sizes: rank {rank} has speed {speed}; every speed must be a positive, "
                             "finite number of samples per second")
        exact.append(Fraction(speed))
    return exact


def _checked_count(value, what: str, least: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < least:
        raise ValueError(f"{what} must be an integer of at least {least}, got {value!r}")
    return int(value)


def _quotas(speeds: List[Fraction], global_batch_size: int, min_batch_size: int) -> List[Fraction]:
    """Exact shares of the global batch in proportion to speed, where a rank whose share would
    fall below the minimum gets the minimum and the others share the rest (water-filling)."""
    quotas: List[Fraction] = [Fraction(0)] * len(speeds)
    free = set(range(len(speeds)))
    left = Fraction(global_batch_size)
    while True:
        total = sum(speeds[rank] for rank in free)
        below = {rank for rank in free if left * speeds[rank] / total < min_batch_size}
        if not below:
            for rank in free:
                quotas[rank] = left * speeds[rank] / total
            return quotas
        for rank in below:
            quotas[rank] = Fraction(min_batch_size)
        free -= below
        left -= min_batch_size * len(below)


def balanced_sizes(speeds: Sequence[float], global_batch_size: int, min_batch_size: int = 1) -> List[int]:
    """Integer local batch sizes, one per rank, that sum to `global_batch_size` exactly, in
    proportion to `speeds` and each at least `min_batch_size`.

    A rank whose proportional share is below the minimum gets the minimum, and the others
    share what is left in proportion. Shares are rounded by largest remainder (ties to the
    lower rank), so each size is within one sample of its exact share.

    Args:
        speeds: each rank's speed in samples per second (positive, finite), in rank order.
        global_batch_size: the samples of one step over all ranks.
        min_batch_size: the fewest samples any rank gets (0 allowed).

    Raises:
        ValueError: a speed that is not positive and finite, or a global batch smaller than
            `len(speeds) * min_batch_size`; the message names the numbers.
    """
    exact = _checked_speeds(speeds)
    global_batch_size = _checked_count(global_batch_size, "global_batch_size", 1)
    min_batch_size = _checked_count(min_batch_size, "min_batch_size", 0)
    if global_batch_size < len(exact) * min_batch_size:
        raise ValueError(f"a global batch of {global_batch_size} samples cannot give each of {len(exact)} ranks "
                         f"at least {min_batch_size} (that needs {len(exact) * min_batch_size}); lower "
                         "min_batch_size or raise global_batch_size")
    quotas = _quotas(exact, global_batch_size, min_batch_size)
    sizes = [math.floor(quota) for quota in quotas]
    short = global_batch_size - sum(sizes)
    by_remainder = sorted(range(len(quotas)), key=lambda rank: (-(quotas[rank] - sizes[rank]), rank))
    for rank in by_remainder[:short]:
        sizes[rank] += 1
    return sizes


def moves_enough(current: Sequence[int], proposed: Sequence[int], threshold: float) -> bool:
    """Whether `proposed` sizes should replace `current` ones: some rank's size changes by more
    than `threshold` (a fraction, 0.1 for 10 %) of its current size, or the two differ in
    length or total (the job or the global batch changed). With threshold 0, any change moves.

    Args:
        current: the sizes in use.
        proposed: the sizes the latest speeds give.
        threshold: the hysteresis, a fraction of each rank's current size (0 or more).
    """
    if threshold < 0:
        raise ValueError(f"the hysteresis threshold must be 0 or more, got {threshold}")
    if len(current) != len(proposed) or sum(current) != sum(proposed):
        return True
    return any(abs(new - old) > threshold * old for old, new in zip(current, proposed))


def departures(speeds: Sequence[float], threshold: float) -> List[Tuple[int, float, float]]:
    """The ranks whose speed departs from the median speed by more than `threshold` (a
    fraction): (rank, speed, speed / median) each, in rank order.

    Args:
        speeds: each rank's speed, in rank order.
        threshold: 0.2 reports ranks more than 20 % faster or slower than the median.
    """
    median = statistics.median(speeds) if len(speeds) else 0.0
    if median <= 0:
        return []
    return [(rank, float(speed), float(speed) / median) for rank, speed in enumerate(speeds)
            if abs(float(speed) / median - 1.0) > threshold]
