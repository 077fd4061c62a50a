"""Bandwidth-optimal ring all-reduce over point-to-point messages, and the two halves it is made of.

The buffer is cut into one segment per rank (`counts[r]` elements for rank r). Each rank
talks to two neighbours only: it receives from the rank on its left and sends to the rank on
its right. In the reduce-scatter half, n-1 steps each pass one segment to the right, and
the receiver folds it into its own copy; after them rank r holds segment r reduced over all
ranks. In the all-gather half, n-1 more steps pass the finished segments around the ring.
Every rank sends and receives about 2(n-1)/n of the buffer, whatever the number of ranks.

Segments travel in pieces of at most `piece_bytes`. A piece is passed on as soon as it is
reduced, so the next rank works on piece i while this one waits for piece i+1, and a
window of receives stays posted while numpy reduces. Received pieces that must be reduced
land in a small scratch buffer, kept per dtype between calls; pieces that are only
gathered land straight in place.

Like every all-reduce algorithm of hvdplus, these functions take a flat, C-contiguous 1-d
buffer already in its accumulation dtype, reduce Average as a sum (the caller divides),
use no MPI collective, and tag their messages with `RING_TAG`. A communicator must not run
two of them at once, and the scratch buffers are not meant for several threads at a time.
"""

import collections
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..common.reduce_ops import ReduceOp
from .mpi_collectives import reducescatter_rows
from .reduction import combine

__all__ = ["RING_TAG", "PIECE_BYTES", "ring_allreduce", "ring_reducescatter", "ring_allgather"]

RING_TAG = 0x52  # Point-to-point tag of every ring message.
PIECE_BYTES = 1 << 20  # Largest message of a ring; segments travel in pieces this size.
_WINDOW = 4  # Receives kept posted ahead of the piece being reduced.

_scratch_by_dtype = {}


def _scratch(dtype: np.dtype, count: int) -> np.ndarray:
    """A receive buffer of at least `count` elements, reused by later calls."""
    buffer = _scratch_by_dtype.get(dtype)
    if buffer is None or buffer.size < count:
        buffer = _scratch_by_dtype[dtype] = np.empty(count, dtype=dtype)
    return buffer


class _RingPass:
    """One call's traffic: which pieces this rank sends, receives, reduces and passes on.

    Steps are numbered over the whole all-reduce: steps 0 to n-2 reduce, steps n-1 to 2n-3
    gather. At every step s this rank receives segment (rank - s - 2) mod n from its left
    neighbour, so a reduce-scatter runs steps 0..n-2 and an all-gather steps n-1..2n-3.
    """

    def __init__(self, comm, flat: np.ndarray, counts, piece_bytes: int):
        self.comm = comm
        self.flat = flat
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self.offsets = [0]
        for count in counts:
            self.offsets.append(self.offsets[-1] + int(count))
        if self.offsets[-1] != flat.size:
            raise ValueError(f"segment counts {list(counts)} add up to {self.offsets[-1]}, "
                             f"but the buffer holds {flat.size} elements")
        self.piece = max(1, piece_bytes // flat.itemsize)

    def pieces(self, segment: int):
        """(start, stop) of each piece of `segment`, which is taken modulo the ring size."""
        start, stop = self.offsets[segment % self.size], self.offsets[segment % self.size + 1]
        return [(begin, min(begin + self.piece, stop)) for begin in range(start, stop, self.piece)]

    def run(self, steps: range, op: Optional[ReduceOp] = None) -> None:
        """Run `steps` of the ring, reducing with `op` (None when `steps` only gather);
        return once every message of this rank has completed."""
        first_gather_step = self.size - 1
        incoming = [
            (step < first_gather_step, step < steps.stop - 1, piece)
            for step in steps
            for piece in self.pieces(self.rank - step - 2)
        ]
        scratch = None
        if steps.start < first_gather_step:
            scratch = _scratch(self.flat.dtype, _WINDOW * self.piece)
        sends = [self._send(piece) for piece in self.pieces(self.rank - steps.start - 1)]
        posted = collections.deque(
            self._post(incoming, k, scratch) for k in range(min(_WINDOW, len(incoming)))
        )
        for k, (reduces, forwards, (start, stop)) in enumerate(incoming):
            request, landed = posted.popleft()
            request.Wait()
            if reduces:
                combine(op, self.flat[start:stop], landed)
            if forwards:
                sends.append(self._send((start, stop)))
            if k + _WINDOW < len(incoming):
                posted.append(self._post(incoming, k + _WINDOW, scratch))
        MPI.Request.Waitall(sends)

    def _send(self, piece):
        start, stop = piece
        return self.comm.Isend(self.flat[start:stop], dest=self.right, tag=RING_TAG)

    def _post(self, incoming, k, scratch):
        """Post the receive of incoming piece `k`: into window slot k mod _WINDOW when it is to
        be reduced (that slot's previous piece is reduced by then), else straight in place."""
        reduces, _, (start, stop) = incoming[k]
        if reduces:
            slot = (k % _WINDOW) * self.piece
            target = scratch[slot:slot + stop - start]
        else:
            target = self.flat[start:stop]
        return self.comm.Irecv(target, source=self.left, tag=RING_TAG), target


def ring_allreduce(comm, flat: np.ndarray, op: ReduceOp, piece_bytes: int = PIECE_BYTES) -> None:
    """Reduce `flat` elementwise over every rank of `comm`, in place.

    Args:
        comm: the communicator whose ranks form the ring; every rank calls with the same size.
        flat: contiguous 1-d buffer in its accumulation dtype; holds the result afterwards.
        op: the reduction; Average is summed (the caller divides).
        piece_bytes: largest message; the same on every rank.
    """
    size = comm.Get_size()
    if size == 1 or flat.size == 0:
        return
    counts = reducescatter_rows(flat.size, size)
    _RingPass(comm, flat, counts, piece_bytes).run(range(0, 2 * size - 2), op)


def ring_reducescatter(
    comm, flat: np.ndarray, op: ReduceOp, counts, piece_bytes: int = PIECE_BYTES
) -> np.ndarray:
    """Reduce `flat` over every rank of `comm` and leave rank r's segment reduced in place.

    Args:
        comm: the communicator whose ranks form the ring.
        flat: contiguous 1-d buffer in its accumulation dtype, the same size on every rank.
            Afterwards only this rank's segment holds the result; the others hold partial sums.
        op: the reduction; Average is summed (the caller divides).
        counts: elements of each rank's segment, in rank order; they add up to `flat.size`.
        piece_bytes: largest message; the same on every rank.

    Returns:
        This rank's reduced segment, a view of `flat`.
    """
    size = comm.Get_size()
    ring = _RingPass(comm, flat, counts, piece_bytes)
    if size > 1:
        ring.run(range(0, size - 1), op)
    start, stop = ring.offsets[ring.rank], ring.offsets[ring.rank + 1]
    return flat[start:stop]


def ring_allgather(comm, flat: np.ndarray, counts, piece_bytes: int = PIECE_BYTES) -> None:
    """Fill every segment of `flat` with its owner's, given that rank r's segment holds rank r's data.

    Args:
        comm: the communicator whose ranks form the ring.
        flat: contiguous 1-d buffer, the same size on every rank.
        counts: elements of each rank's segment, in rank order; they add up to `flat.size`.
        piece_bytes: largest message; the same on every rank.
    """
    size = comm.Get_size()
    if size == 1:
        return
    _RingPass(comm, flat, counts, piece_bytes).run(range(size - 1, 2 * size - 2))
