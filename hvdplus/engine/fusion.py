"""Tensor fusion: which ready all-reduces travel together, and the buffer they travel in.

Many small all-reduces cost many latencies; one all-reduce of their concatenation costs
one. All-reduces that share dtype, op and scale factors are packed, in the order they
became ready, into batches of at most the fusion threshold (a grouped all-reduce arrives
already packed as one array, see hvdplus/engine/groups.py).
"""

import math

import numpy as np

from ..common.dtypes import accumulation_dtype

__all__ = ["AVERAGED_WHILE_PACKING", "fusion_key", "fused_nbytes", "FusionBuffer"]

# The agreed mark of an Average whose 1/size every rank applied as it packed its tensors,
# so that the sum is already the average (see hvdplus/engine/groups.py).
AVERAGED_WHILE_PACKING = "averaged while packing"


def fusion_key(request):
    """All-reduces with equal keys may share a batch."""
    agree = request.agree
    return (agree["dtypes"], agree["reduce ops"], agree["prescale factors"], agree["postscale factors"],
            AVERAGED_WHILE_PACKING in agree)


def fused_nbytes(request) -> int:
    """Bytes the tensor takes in the fusion buffer (its accumulation dtype)."""
    return math.prod(request.agree["shapes"]) * accumulation_dtype(request.agree["dtypes"]).itemsize


class FusionBuffer:
    """One reusable buffer per accumulation dtype, grown on demand, never shrunk."""

    def __init__(self):
        self._buffers = {}

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.size < count:
            buffer = self._buffers[dtype] = np.empty(max(count, 1), dtype=dtype)
        return buffer[:count]
