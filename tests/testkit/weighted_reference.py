"""The numpy side of the in-rank weighted-average tests (tests/mpi/test_*_load_balance.py): each
rank's uneven sample count and values, which every rank can compute for every rank, and the
weighted average they should all-reduce to."""

import numpy as np

__all__ = ["COUNTS", "counts", "values_of", "numpy_weighted_average", "global_batches", "record_a_slow_start",
           "assert_the_sizes_moved"]

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


def global_batches(total, steps, features, outputs):
    """`steps` global batches of `total` samples, (x, y) in float32, the same on every rank."""
    rng = np.random.default_rng(4321)
    return [(rng.standard_normal((total, features)).astype("float32"),
             rng.standard_normal((total, outputs)).astype("float32")) for _ in range(steps)]


def record_a_slow_start(balancer, samples, step, steps):
    """Record a made-up step time in which the last rank is 3x slow for the first half of the
    run, then as fast as the others; rebalance and return the new sizes."""
    process_set = balancer.process_set
    slow = 3.0 if process_set.rank() == process_set.size() - 1 and step < steps // 2 else 1.0
    balancer.record(samples, samples * 0.001 * slow)
    return balancer.rebalance()


def assert_the_sizes_moved(history, global_batch, size):
    """The sizes after each step left the even split, and changed during the run."""
    if size > 1:
        assert len({tuple(sizes) for sizes in history}) > 1 and min(history[0]) < global_batch / size - 2, history
