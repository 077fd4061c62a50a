"""The numpy side of the in-rank weighted-average tests (tests/mpi/test_*_load_balance.py): each
rank's uneven sample count and values, which every rank can compute for every rank, and the
weighted average they should all-reduce to."""

import numpy as np

__all__ = ["COUNTS", "counts", "values_of", "numpy_weighted_average"]

COUNTS = (5, 17, 42)  # uneven local batches, one per rank (round robin beyond three ranks)


def counts(size):
    """Every rank's sample count, in rank order."""
    return [COUNTS[rank % len(COUNTS)] for rank in range(size)]


def values_of(rank, shape=(4, 3)):
    """Rank `rank`'s values (float64), seeded by the rank alone."""
    return np.random.default_rng(100 + rank).standard_normal(shape)


def numpy_weighted_average(arrays, weights):
    """sum_i(w_i a_i) / sum_i(w_i), in float64."""
    weights = np.asarray(weights, dtype=np.float64)
    return sum(w * a.astype(np.float64) for w, a in zip(weights, arrays)) / weights.sum()
