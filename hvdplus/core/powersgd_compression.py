"""Compression.powersgd(rank, warmup_steps): PowerSGD (Vogels et al., 2019) as torch DDP's
PowerSGD hook does it, per tensor.

A gradient of 2 or more dimensions is the matrix M (n x m: its first dimension by the rest),
plus the error feedback. P = M Q is summed over the ranks and orthogonalized, Q = M^T P is
summed, and the average is P Q^T / N: (n + m) r numbers move instead of n m. Q is kept
(warm start: one power iteration per step refines last step's subspace); the first Q comes
from a generator seeded by the tensor's name, the same on every rank. Vectors, tensors too
small to gain (n m < min_compression_rate (n + m) r) and every tensor in its first
`warmup_steps` reductions are all-reduced plainly.
"""

import numpy as np

from ..common.powersgd_math import check_rank, matrix_shape, orthogonalize, starting_q
from ..common.reduce_ops import ReduceOp
from .collectives import allreduce_async
from .compressed_reduction import LossyCompression, sub_name
from .process_sets import size_in

__all__ = ["PowerSGDCompression", "Q_KEY", "STEPS_KEY"]

Q_KEY = "powersgd_q"
STEPS_KEY = "powersgd_steps"


class PowerSGDCompression(LossyCompression):
    """`Compression.powersgd(rank=r, warmup_steps=w, min_compression_rate=2)`."""

    label = "powersgd"

    def __init__(self, rank=1, warmup_steps=10, min_compression_rate=2.0):
        self.rank = check_rank(rank)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"Compression.powersgd(warmup_steps=...): an integer of 0 or more, got {warmup_steps!r}")
        if not min_compression_rate > 0:
            raise ValueError(f"Compression.powersgd(min_compression_rate=...): a positive number, got "
                             f"{min_compression_rate!r}")
        self.warmup_steps = warmup_steps
        self.min_compression_rate = float(min_compression_rate)

    def __repr__(self):
        return f"Compression.powersgd(rank={self.rank}, warmup_steps={self.warmup_steps})"

    def _stages(self, array, name, state, factor, process_set):
        shape = matrix_shape(array.shape, self.rank, self.min_compression_rate)
        warming = False
        if state is not None:
            reductions = state.count(STEPS_KEY)
            state.set_count(STEPS_KEY, reductions + 1)
            warming = reductions < self.warmup_steps
        if shape is None or warming:
            yield from self._plain(array, name, factor, process_set)
            return
        n, m = shape
        rank = min(self.rank, n, m)
        matrix = self._compensated(array.reshape(-1), state).reshape(n, m)
        initial = lambda: starting_q(name or "", m, rank, array.dtype)  # noqa: E731
        q = initial() if state is None else state.array(Q_KEY, (m, rank), array.dtype, initial)
        p_sum = allreduce_async(self._submitted("allreduce", matrix @ q), name, ReduceOp.SUM, process_set=process_set)
        yield
        p = orthogonalize(p_sum.wait()).astype(array.dtype)
        q_sum = allreduce_async(self._submitted("allreduce", np.ascontiguousarray(matrix.T @ p)),
                                sub_name(name, "powersgd_q"), ReduceOp.SUM, process_set=process_set)
        yield
        q[...] = q_sum.wait()
        ranks = size_in(process_set, repr(self))
        average = p @ q.T / ranks
        self._keep_error(state, matrix.reshape(-1), average.reshape(-1))
        array.reshape(-1)[...] = (average * (ranks * factor)).reshape(-1)

    def _plain(self, array, name, factor, process_set):
        summed = allreduce_async(self._submitted("allreduce", array), name, ReduceOp.SUM, postscale_factor=factor,
                                 output=array, process_set=process_set)
        yield
        summed.wait()
