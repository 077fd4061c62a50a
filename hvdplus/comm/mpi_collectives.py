"""Collectives delegated to the MPI library, on arrays whose arguments were already checked.

Every function takes the communicator explicitly and returns a new array. Data that is only
moved travels as bytes, so any dtype (bfloat16 too) is carried unchanged; data that is
reduced travels in its accumulation dtype (see `hvdplus.common.dtypes`).
"""

import math
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ..common.dtypes import accumulation_dtype
from ..common.reduce_ops import ReduceOp
from ..common.scaling import scale_factor
from .reduction import apply_scale

__all__ = ["MPI_OPS", "prepare_reduction", "finish_reduction", "allgather", "broadcast", "alltoall", "reducescatter",
           "reducescatter_rows"]

MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _row_bytes(array: np.ndarray) -> int:
    return math.prod(array.shape[1:]) * array.dtype.itemsize


def _displacements(counts: Sequence[int]) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts[:-1], dtype=np.int64))).astype(np.int64)


def prepare_reduction(array, prescale_factor):
    """`array` C-contiguous, in its accumulation dtype and prescaled: a new array whenever any
    of that changed it, else `array` itself, which the caller must then not write to."""
    work = np.ascontiguousarray(array, dtype=accumulation_dtype(array.dtype))
    if prescale_factor != 1.0:
        work = apply_scale(work, prescale_factor, out=np.empty_like(work))
    return work


def finish_reduction(work, op, postscale_factor, size):
    """Apply Average's division and the postscale factor, in place."""
    factor = scale_factor(op, 1.0, postscale_factor, size)
    if factor != 1.0:
        apply_scale(work, factor)


def allgather(comm, array, first_dims: Sequence[int]):
    """Concatenate every rank's `array` along axis 0; rank r contributes `first_dims[r]` rows."""
    row_bytes = _row_bytes(array)
    output = np.empty((sum(first_dims),) + array.shape[1:], dtype=array.dtype)
    counts = np.asarray(first_dims, dtype=np.int64) * row_bytes
    comm.Allgatherv(_as_bytes(array), [_as_bytes(output), counts, _displacements(counts), MPI.BYTE])
    return output


def broadcast(comm, array, root_rank: int):
    """Every rank gets a copy of `root_rank`'s `array` (others pass same-shaped arrays)."""
    output = np.array(array, order="C", copy=True)
    if comm.Get_size() > 1 and output.size:
        comm.Bcast([output.reshape(-1).view(np.uint8), MPI.BYTE], root=root_rank)
    return output


def alltoall(comm, array, send_splits: Sequence[int], recv_splits: Sequence[int]):
    """Send rows `send_splits[r]` of `array` to rank r; receive `recv_splits[r]` rows from it."""
    row_bytes = _row_bytes(array)
    output = np.empty((int(sum(recv_splits)),) + array.shape[1:], dtype=array.dtype)
    send_counts = np.asarray(send_splits, dtype=np.int64) * row_bytes
    recv_counts = np.asarray(recv_splits, dtype=np.int64) * row_bytes
    comm.Alltoallv(
        [_as_bytes(array), send_counts, _displacements(send_counts), MPI.BYTE],
        [_as_bytes(output), recv_counts, _displacements(recv_counts), MPI.BYTE],
    )
    return output


def reducescatter_rows(first_dim: int, size: int) -> list:
    """Rows of a `first_dim`-row array that each rank keeps: the first ranks take the remainder."""
    base, extra = divmod(first_dim, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def reducescatter(comm, array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce `array` over all ranks and keep this rank's block of rows."""
    size = comm.Get_size()
    rows = reducescatter_rows(array.shape[0], size)
    row_elems = math.prod(array.shape[1:])
    work = prepare_reduction(array, prescale_factor)
    output = np.empty((rows[comm.Get_rank()],) + array.shape[1:], dtype=work.dtype)
    if size == 1:
        output[...] = work
    else:
        counts = [r * row_elems for r in rows]
        comm.Reduce_scatter(work.reshape(-1), output.reshape(-1), recvcounts=counts, op=MPI_OPS[op])
    finish_reduction(output, op, postscale_factor, size)
    return output.astype(array.dtype, copy=False)
