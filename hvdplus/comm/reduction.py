"""Elementwise reduction of numpy buffers, shared by every all-reduce algorithm of hvdplus.

Algorithms reduce flat, C-contiguous buffers that are already in their accumulation dtype
(see `hvdplus.common.dtypes`); Average is reduced as a sum and divided afterwards.
"""

import numpy as np

from ..common.reduce_ops import ReduceOp

__all__ = ["UFUNCS", "combine", "apply_scale"]

UFUNCS = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def combine(op: ReduceOp, into: np.ndarray, other: np.ndarray) -> None:
    """into = op(into, other), in place, without a temporary."""
    UFUNCS[op](into, other, out=into)


def apply_scale(array: np.ndarray, factor: float, out: np.ndarray = None) -> np.ndarray:
    """`out` (default: `array`, in place) = `factor` * `array`. Integers are scaled in float64
    and truncated toward zero, as Horovod scales them (an integer Average truncates)."""
    out = array if out is None else out
    return np.multiply(array, factor, out=out, casting="unsafe")
