"""Adasum, Horovod's adaptive summation of gradients, on every rank's vector.

Two gradients a and b combine as

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is their sum when they are orthogonal and their mean when they are equal, so the
step does not grow with the number of ranks where the ranks agree. Over 2^k ranks the
pairs combine as a binary tree: ranks (0, 1), (2, 3)... first, then the pairs' results,
and so on, as Horovod's recursive halving combines them. Each tensor is combined on its
own; dot products and norms are taken in float64, and a coefficient stays 1 when its
vector's squared norm is below 1e-8, as in Horovod.
"""

import numpy as np

__all__ = ["adasum_pair", "adasum_tree", "check_power_of_two"]

_TINY = 1e-8


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two flat vectors of one dtype, as a new array of that dtype."""
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    dot = float(np.dot(a64, b64))
    a_norm, b_norm = float(np.dot(a64, a64)), float(np.dot(b64, b64))
    a_coefficient = 1.0 - dot / (2 * a_norm) if a_norm >= _TINY else 1.0
    b_coefficient = 1.0 - dot / (2 * b_norm) if b_norm >= _TINY else 1.0
    return (a_coefficient * a64 + b_coefficient * b64).astype(a.dtype, copy=False)


def adasum_tree(rows: np.ndarray) -> np.ndarray:
    """Adasum of every rank's flat vector (`rows[r]` is rank r's), combined as a binary tree."""
    level = [row for row in rows]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def check_power_of_two(size: int, what: str) -> None:
    if size < 1 or size & (size - 1):
        raise NotImplementedError(
            f"{what}: Adasum needs a power-of-two number of ranks, not {size} "
            "(Horovod: 'Running Adasum with non-power of 2 ranks is not supported yet.')")
