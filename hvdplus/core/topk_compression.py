"""Compression.topk(ratio): each rank sends its ceil(ratio n) entries largest in magnitude,
as (index, value) pairs in one allgather each; every rank sums them into a dense result."""

import numpy as np

from ..common.topk_codec import check_ratio, kept_count, largest, scatter_sum
from .collectives import allgather_async
from .compressed_reduction import LossyCompression, sub_name

__all__ = ["TopKCompression"]


class TopKCompression(LossyCompression):
    """`Compression.topk(ratio)`, ratio in (0, 1]; error feedback with DistributedOptimizer."""

    label = "topk"

    def __init__(self, ratio):
        self.ratio = check_ratio(ratio)

    def __repr__(self):
        return f"Compression.topk({self.ratio})"

    def _stages(self, array, name, state, factor, process_set):
        flat = array.reshape(-1)
        compensated = self._compensated(flat, state)
        indices, values = largest(compensated, kept_count(flat.size, self.ratio))
        indices_handle = allgather_async(self._submitted("allgather", indices), name, process_set=process_set)
        values_handle = allgather_async(self._submitted("allgather", values), sub_name(name, "topk_values"),
                                        process_set=process_set)
        sent = np.zeros_like(compensated)
        sent[indices] = values
        self._keep_error(state, compensated, sent)
        yield
        flat[...] = scatter_sum(flat.size, indices_handle.wait(), values_handle.wait(), factor, flat.dtype)
