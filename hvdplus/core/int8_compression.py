"""Compression.int8: gradients as int8 with scales per chunk agreed across ranks.

Stage 1 all-reduces (MAX) each chunk's max|x|, so every rank quantizes with the same scale;
stage 2 sums the int8 values exactly, where no rank count can overflow. Under 4 ranks the
int8 payloads are allgathered and summed here in int32: a ring allgather sends (N-1) n bytes
per rank, fewer than an int16 all-reduce's 2 (N-1)/N 2n. From 4 ranks on the int8 values are
all-reduced as int16 (int32 past 258 ranks, where 127 N no longer fits int16), which sends
at most the allgather's bytes and keeps no N copies. Either way the result is exact for the
quantized values, and it is scaled in float64, so a float32 average of values near float32's
largest does not overflow on the way.
"""

import numpy as np

from ..common.int8_codec import chunk_absmax, chunk_scales, dequantize, quantize, summing_dtype
from ..common.reduce_ops import ReduceOp
from .collectives import allgather_async, allreduce_async
from .compressed_reduction import LossyCompression, sub_name
from .process_sets import size_in

__all__ = ["Int8Compression", "ALLGATHER_BELOW_RANKS"]

ALLGATHER_BELOW_RANKS = 4


class Int8Compression(LossyCompression):
    """`Compression.int8`, or `Compression.int8(stochastic=True, seed=None)` for stochastic
    (unbiased) rounding; error feedback with DistributedOptimizer."""

    label = "int8"

    def __init__(self, stochastic=False, seed=None):
        self.stochastic = bool(stochastic)
        self._rng = np.random.default_rng(seed) if self.stochastic else None

    def __call__(self, stochastic=False, seed=None):
        return Int8Compression(stochastic, seed)

    def __repr__(self):
        return f"Compression.int8(stochastic={self.stochastic})"

    def _stages(self, array, name, state, factor, process_set):
        flat = array.reshape(-1)
        compensated = self._compensated(flat, state)
        absmax = self._submitted("allreduce", chunk_absmax(compensated))
        agreed = allreduce_async(absmax, name, ReduceOp.MAX, process_set=process_set)
        yield
        agreed = agreed.wait()
        if not np.isfinite(agreed).all():
            raise ValueError(f"{self!r}: '{name}' holds inf or nan on some rank, which int8 cannot carry")
        scales = chunk_scales(agreed)
        integers = quantize(compensated, scales, self._rng)
        self._keep_error(state, compensated, dequantize(integers, scales, flat.size))
        ranks = size_in(process_set, repr(self))
        if ranks < ALLGATHER_BELOW_RANKS:
            gathered = allgather_async(self._submitted("allgather", integers), sub_name(name, "int8"),
                                       process_set=process_set)
            yield
            total = gathered.wait().reshape(ranks, flat.size).sum(axis=0, dtype=np.int32)
        else:
            wide = self._submitted("allreduce", integers.astype(summing_dtype(ranks)))
            summed = allreduce_async(wide, sub_name(name, "int8"), ReduceOp.SUM, process_set=process_set)
            yield
            total = summed.wait()
        flat[...] = dequantize(total, scales, flat.size, factor)
