"""Turning a user's arguments into checked values, with errors that name the tensor."""

import numbers
import os
import sys
import warnings

import numpy as np

from ..common.dtypes import check_supported, is_integer
from ..common.reduce_ops import ReduceOp, as_reduce_op

__all__ = ["checked_array", "check_output", "reduction_arguments", "check_root_rank", "check_has_rows",
           "alltoall_splits"]


def checked_array(value, what: str) -> np.ndarray:
    """`value` as a numpy array of a supported dtype (no copy when it already is one)."""
    array = np.asarray(value)
    check_supported(array.dtype, what)
    return array


def check_output(output, data: np.ndarray, what: str) -> None:
    """An output array must match `data` and be writable in place."""
    if not isinstance(output, np.ndarray):
        raise TypeError(f"{what}: output must be a numpy array, got {type(output).__name__}")
    if output.shape != data.shape or output.dtype != data.dtype:
        raise ValueError(
            f"{what}: output has shape {output.shape} and dtype {output.dtype}, "
            f"expected {data.shape} and {data.dtype}"
        )
    if not output.flags.c_contiguous or not output.flags.writeable:
        raise ValueError(f"{what}: output must be C-contiguous and writeable")


def _scale(factor, label: str, what: str) -> float:
    if type(factor) is float:  # the common case, without the slow abstract-class check
        return factor
    if not isinstance(factor, numbers.Real):
        raise TypeError(f"{what}: {label} must be a real number, got {type(factor).__name__}")
    return float(factor)


def reduction_arguments(array: np.ndarray, op, prescale_factor, postscale_factor, what: str):
    """(op, prescale, postscale) after checking they make sense for `array`'s dtype.

    Integers follow Horovod: they are summed exactly, and Average and the scale factors are
    applied in float64 and truncated toward zero (each rank's prescaled values before the
    sum, the result after it). An integer Average warns once, since it rounds.
    """
    op = as_reduce_op(op)
    if op == ReduceOp.ADASUM:  # allreduce takes it before planning an elementwise reduction
        raise ValueError(f"{what}: op Adasum combines whole tensors; only allreduce takes it")
    prescale = _scale(prescale_factor, "prescale_factor", what)
    postscale = _scale(postscale_factor, "postscale_factor", what)
    dtype = array.dtype
    if dtype == np.bool_:
        if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise TypeError(
                f"{what}: op {op.label} is not defined for bool; use Max (logical or) or Min (logical and)"
            )
        if prescale != 1.0 or postscale != 1.0:
            raise TypeError(f"{what}: scale factors are not defined for bool")
    elif op == ReduceOp.AVERAGE and is_integer(dtype):
        _warn_integer_average_once(what, dtype)
    return op, prescale, postscale


_warned_integer_average = False


def _warn_integer_average_once(what: str, dtype: np.dtype) -> None:
    global _warned_integer_average
    if not _warned_integer_average:
        _warned_integer_average = True
        warnings.warn(f"{what}: op Average on integer dtype {dtype.name} truncates the mean toward zero, "
                      "as Horovod does; use op=Sum, or a floating dtype, for the exact result",
                      stacklevel=_user_stack_level())


def _user_stack_level() -> int:
    """warnings.warn's stacklevel, from its caller here, of the first frame outside hvdplus:
    the user's call, whichever adapter it went through."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def check_root_rank(root_rank, size: int, what: str) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"{what}: root_rank must be an int, got {type(root_rank).__name__}")
    if not 0 <= root_rank < size:
        raise ValueError(f"{what}: root_rank {root_rank} is out of range for a job of {size} ranks")
    return int(root_rank)


def check_has_rows(array: np.ndarray, what: str) -> None:
    if array.ndim == 0:
        raise ValueError(f"{what} is a scalar; this collective splits or joins along a first dimension")


def alltoall_splits(array: np.ndarray, splits, size: int, what: str) -> list:
    """Rows of `array` to send to each rank: `splits`, or an even division when None."""
    first_dim = array.shape[0]
    if splits is None:
        if first_dim % size:
            raise ValueError(
                f"{what}: first dimension {first_dim} is not divisible by {size} ranks; pass splits"
            )
        return [first_dim // size] * size
    splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(splits) != size:
        raise ValueError(f"{what}: splits has {len(splits)} entries, expected one per rank ({size})")
    if any(s < 0 for s in splits):
        raise ValueError(f"{what}: splits {splits} has negative entries")
    if sum(splits) != first_dim:
        raise ValueError(f"{what}: splits {splits} sum to {sum(splits)}, but the first dimension is {first_dim}")
    return splits
