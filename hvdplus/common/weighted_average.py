"""The weighted average over ranks, sum of w_i x_i over sum of w_i, as one Sum all-reduce.

Each rank sends one buffer: its array times its weight, followed by one slot per rank that
holds its weight in its own slot and zero in the others. After the Sum every rank holds the
weighted sum and every rank's weight, so it divides by their total and can name, on every
rank alike, the weights when they sum to zero. The buffer is in the array's reduction type
(float32 for the half types), so float64 tensors keep their precision.
"""

import math
from typing import Callable, Optional

import numpy as np

from .dtypes import accumulation_dtype, dtype_name

__all__ = ["weighted_buffer", "weighted_result"]


def _checked_weight(weight, name: str, rank: int) -> float:
    try:
        value = float(np.asarray(weight).item())
    except (TypeError, ValueError):
        raise TypeError(f"allreduce {name!r}: rank {rank} gave weight {weight!r}, which is no single number")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"allreduce {name!r}: rank {rank} gave weight {value}; a weight must be a finite "
                         "number of 0 or more")
    return value


def weighted_buffer(array: np.ndarray, weight, name: str, rank: int, size: int) -> np.ndarray:
    """The buffer this rank sends to a Sum all-reduce for a weighted average of `array`.

    Args:
        array: this rank's values (a floating dtype).
        weight: this rank's weight, a number of 0 or more (its sample count, say).
        name: the tensor's name, for errors.
        rank: this rank within the process set.
        size: the ranks of the process set.

    Raises:
        TypeError: `array` is not a floating numpy array, or `weight` is no single number.
        ValueError: `weight` is negative or not finite.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"allreduce {name!r}: expected a numpy array, got {type(array).__name__}")
    if dtype_name(array.dtype) not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"allreduce {name!r}: a weighted average needs a floating tensor, got dtype "
                        f"{array.dtype.name}")
    value = _checked_weight(weight, name, rank)
    reduction = accumulation_dtype(array.dtype)
    buffer = np.zeros(array.size + size, dtype=reduction)
    # Widened first, then weighed: a product in float16 or bfloat16 would round a weight of 257
    # to 256 (bfloat16) or overflow past 65504 (float16) before the sum.
    buffer[:array.size] = array.reshape(-1)
    buffer[:array.size] *= value
    buffer[array.size + rank] = value
    return buffer


def weighted_result(shape, dtype, name: str, size: int, scale: float = 1.0,
                    output: Optional[np.ndarray] = None) -> Callable[[np.ndarray], np.ndarray]:
    """The finishing step that turns the summed buffer into the weighted average: an array of
    `shape` and `dtype` (written into `output` when given), times `scale`.

    It raises ValueError, the same on every rank, when the weights sum to zero, naming the
    tensor and each rank's weight."""

    def finish(summed: np.ndarray) -> np.ndarray:
        weights = summed[-size:]
        total = float(weights.sum(dtype=np.float64))
        if not total > 0:
            listed = ", ".join(f"rank {rank} had {float(weight):g}" for rank, weight in enumerate(weights))
            raise ValueError(f"allreduce {name!r}: the weights of a weighted average sum to {total:g} ({listed}); "
                             "at least one rank needs a positive weight")
        average = summed[:-size] * (scale / total)
        result = average.reshape(shape).astype(dtype, copy=False)
        if output is None:
            return result
        np.copyto(output, result)
        return output

    return finish
