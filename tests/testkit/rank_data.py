"""The data each rank contributes to a collective in the in-rank suites (tests/mpi/), made
from a seed and the rank's number so every rank can rebuild every other rank's data."""

import numpy as np


def rank_values(dtype, shape, rank, seed, low=-3, high=3):
    """The data rank `rank` contributes; every rank can rebuild every other rank's data,
    so each computes the expected result with numpy on its own."""
    rng = np.random.default_rng([seed, rank])
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        low = max(low, 0) if dtype.kind == "u" else low
        return rng.integers(low, high + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)
