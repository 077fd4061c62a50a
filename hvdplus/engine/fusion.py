"""Tensor fusion: which ready all-reduces travel together, and the buffer they travel in.

Many small all-reduces cost many latencies; one all-reduce of their concatenation costs
one. All-reduces that share dtype, op and scale factors are packed, in the order they
became ready, into batches of at most the fusion threshold (a grouped all-reduce arrives
already packed as one array, see hvdplus/engine/packing.py).
"""

import math

import numpy as np

from ..common.dtypes import accumulation_dtype

__all__ = ["fusion_key", "fused_nbytes", "FusionBuffer"]


def fusion_key(request):
    """All-reduces with equal keys may share a batch (an Average applied while packing a
    group is a plain sum, so it fuses only with its like: see groups.py)."""
    agree = request.agree
    return (agree.dtype, agree.reduce_op, agree.prescale, agree.postscale, agree.averaged_while_packing)


def fused_nbytes(request) -> int:
    """Bytes the tensor takes in the fusion buffer (its accumulation dtype)."""
    return math.prod(request.agree.shape) * accumulation_dtype(request.agree.dtype).itemsize


class FusionBuffer:
    """One reusable buffer per accumulation dtype, grown on demand, never shrunk."""

    def __init__(self):
        self._buffers = {}

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.size < count:
            buffer = self._buffers[dtype] = np.empty(max(count, 1), dtype=dtype)
        return buffer[:count]
