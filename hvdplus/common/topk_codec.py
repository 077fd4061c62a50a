"""Top-k sparsification, framework-free (numpy): the arithmetic behind Compression.topk."""

import math

import numpy as np

__all__ = ["check_ratio", "kept_count", "largest", "scatter_sum"]


def check_ratio(ratio) -> float:
    """`ratio` as a float in (0, 1], else ValueError."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"Compression.topk(ratio): ratio must be a number in (0, 1], got {ratio!r}")
    return float(ratio)


def kept_count(size: int, ratio: float) -> int:
    """How many of `size` entries each rank sends: ceil(ratio * size), at least one."""
    return max(1, min(size, math.ceil(ratio * size)))


def largest(flat: np.ndarray, k: int):
    """(indices, values) of the `k` entries of `flat` largest in magnitude; the indices as
    int32 where they fit, the narrower payload."""
    if k >= flat.size:
        indices = np.arange(flat.size)
    else:
        indices = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]
    index_dtype = np.int32 if flat.size <= np.iinfo(np.int32).max else np.int64
    return indices.astype(index_dtype), flat[indices]


def scatter_sum(size: int, indices: np.ndarray, values: np.ndarray, factor: float, dtype) -> np.ndarray:
    """A dense vector of `size` holding factor * the sum of `values` at `indices` (repeats add up)."""
    dense = np.zeros(size, dtype=np.float64)
    np.add.at(dense, indices.astype(np.int64), values.astype(np.float64))
    return (dense * factor).astype(dtype)
