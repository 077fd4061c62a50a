"""Adasum, Horovod's adaptive summation of gradients, on every rank's vector.

Two gradients a and b combine as

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is their sum when they are orthogonal and their mean when they are equal, so the
step does not grow with the number of ranks where the ranks agree. Over 2^k ranks the
pairs combine as a binary tree: ranks (0, 1), (2, 3)... first, then the pairs' results,
and so on, as Horovod's recursive halving combines them. Each tensor is combined on its
own, in float64, and rounded to its dtype once, at the end.

The coefficients depend on directions only, so dot products and norms are taken on each
vector scaled by a power of two to a largest element in [0.5, 1): exact scaling, after
which nothing underflows or overflows, whatever the magnitude (a float64 vector near 1e-300,
whose squares are below the smallest float64, a float16 one near its smallest normal). A zero
vector leaves the other unchanged.
"""

import numpy as np

__all__ = ["adasum_pair", "adasum_tree", "check_power_of_two"]


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two flat vectors of one dtype, as a new array of that dtype."""
    return _combine(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype, copy=False)


def adasum_tree(rows: np.ndarray) -> np.ndarray:
    """Adasum of every rank's flat vector (`rows[r]` is rank r's), combined as a binary tree."""
    level = [row.astype(np.float64) for row in rows]
    while len(level) > 1:
        level = [_combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0].astype(rows.dtype, copy=False)


def _combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of float64 vectors a = a_scale * a_unit and b = b_scale * b_unit, written so
    that only the units meet in a product:

        a.b / (2 |a|^2) * a  =  b_scale * (a_unit.b_unit) / (2 |a_unit|^2) * a_unit
    """
    a_unit, a_scale = _unit_and_scale(a)
    b_unit, b_scale = _unit_and_scale(b)
    dot = float(np.dot(a_unit, b_unit))
    result = a + b
    for unit, other_scale in ((a_unit, b_scale), (b_unit, a_scale)):
        norm = float(np.dot(unit, unit))
        if norm > 0:  # a zero vector's coefficient stays 1
            result -= (other_scale * dot / (2 * norm)) * unit
    return result


def _unit_and_scale(vector: np.ndarray):
    """(vector / 2^e, 2^e), with 2^e the power of two that brings the largest magnitude
    into [0.5, 1); (vector, 1.0) for a zero vector."""
    largest = float(np.max(np.abs(vector), initial=0.0))
    if largest == 0 or not np.isfinite(largest):
        return vector, 1.0
    exponent = int(np.frexp(largest)[1])
    return np.ldexp(vector, -exponent), float(np.ldexp(1.0, exponent))


def check_power_of_two(size: int, what: str) -> None:
    if size < 1 or size & (size - 1):
        raise NotImplementedError(
            f"{what}: Adasum needs a power-of-two number of ranks, not {size} "
            "(Horovod: 'Running Adasum with non-power of 2 ranks is not supported yet.')")
