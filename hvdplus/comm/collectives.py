"""Synchronous collectives on numpy arrays, checked across ranks before any data moves.

Each call first exchanges a small `Request` with every rank (dtype, shape, op, root...,
or the rank's own argument error). When anything differs, every rank raises the same
exception naming the tensor and what each rank had, and the job can go on.
"""

from typing import Callable, Optional, Tuple

import numpy as np

from ..common import runtime
from ..common.reduce_ops import ReduceOp
from ..common.requests import Request, check_agreement, input_error
from . import arguments, mpi_collectives

__all__ = [
    "allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "broadcast_object", "allgather_object",
]


def _agree(kind: str, name: Optional[str], plan: Callable[[str], Tuple[Request, object]]):
    """Run `plan(name)` locally, then make sure every rank planned the same call.

    Returns (live runtime, this rank's payload from `plan`, every rank's Request).
    """
    live = runtime.current(f"{kind}()")
    name = live.name_for(kind, name)
    try:
        request, payload = plan(name)
    except (TypeError, ValueError) as exc:
        if live.topology.size == 1:
            raise
        request, payload = input_error(kind, name, exc), None
    if live.topology.size == 1:
        return live, payload, [request]
    requests = live.comm.allgather(request)
    check_agreement(requests)
    return live, payload, requests


def _reduction_plan(kind, array, op, prescale_factor, postscale_factor):
    def plan(name):
        what = f"{kind} '{name}'"
        data = arguments.as_array(array, what)
        if kind == "reducescatter":
            arguments.check_has_rows(data, what)
        scales = arguments.reduction_arguments(data, op, prescale_factor, postscale_factor, what)
        agree = {
            "dtypes": data.dtype.name,
            "shapes": data.shape,
            "reduce ops": scales[0],
            "prescale factors": scales[1],
            "postscale factors": scales[2],
        }
        return Request(kind, name, agree), (data,) + scales

    return plan


def allreduce(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """Elementwise reduction of `array` over all ranks; every rank gets the result.

    Average divides the sum by size(); half types are reduced in float32.
    """
    live, (data, op, pre, post), _ = _agree(
        "allreduce", name, _reduction_plan("allreduce", array, op, prescale_factor, postscale_factor)
    )
    return mpi_collectives.allreduce(live.comm, data, op, pre, post)


def reducescatter(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """Reduce `array` over all ranks; rank r keeps block r of the rows (the first
    `dim0 % size` ranks get one row more)."""
    live, (data, op, pre, post), _ = _agree(
        "reducescatter", name,
        _reduction_plan("reducescatter", array, op, prescale_factor, postscale_factor),
    )
    return mpi_collectives.reducescatter(live.comm, data, op, pre, post)


def allgather(array, name=None):
    """Concatenate every rank's `array` along the first dimension, which may differ per rank."""

    def plan(name):
        data = arguments.as_array(array, f"allgather '{name}'")
        arguments.check_has_rows(data, f"allgather '{name}'")
        agree = {"dtypes": data.dtype.name, "trailing dimensions": data.shape[1:]}
        return Request("allgather", name, agree, local={"rows": data.shape[0]}), data

    live, data, requests = _agree("allgather", name, plan)
    return mpi_collectives.allgather(live.comm, data, [r.local["rows"] for r in requests])


def broadcast(array, root_rank=0, name=None):
    """Every rank gets `root_rank`'s `array`; the others' arrays give only shape and dtype."""

    def plan(name):
        what = f"broadcast '{name}'"
        data = arguments.as_array(array, what)
        root = arguments.check_root_rank(root_rank, runtime.size(), what)
        agree = {"root ranks": root, "dtypes": data.dtype.name, "shapes": data.shape}
        return Request("broadcast", name, agree), (data, root)

    live, (data, root), _ = _agree("broadcast", name, plan)
    return mpi_collectives.broadcast(live.comm, data, root)


def alltoall(array, splits=None, name=None):
    """Send rows `splits[r]` of `array` to rank r (even split when None).

    Returns (received rows concatenated in rank order, rows received from each rank).
    """

    def plan(name):
        what = f"alltoall '{name}'"
        data = arguments.as_array(array, what)
        arguments.check_has_rows(data, what)
        send = arguments.alltoall_splits(data, splits, runtime.size(), what)
        agree = {"dtypes": data.dtype.name, "trailing dimensions": data.shape[1:]}
        return Request("alltoall", name, agree, local={"splits": send}), (data, send)

    live, (data, send), requests = _agree("alltoall", name, plan)
    me = live.topology.rank
    received = [request.local["splits"][me] for request in requests]
    output = mpi_collectives.alltoall(live.comm, data, send, received)
    return output, np.asarray(received, dtype=np.int64)


def barrier(name=None):
    """Return once every rank has called barrier()."""
    _agree("barrier", name, lambda name: (Request("barrier", name), None))


def broadcast_object(obj, root_rank=0, name=None):
    """`root_rank`'s picklable `obj`, on every rank."""

    def plan(name):
        root = arguments.check_root_rank(root_rank, runtime.size(), f"broadcast_object '{name}'")
        return Request("broadcast_object", name, {"root ranks": root}), root

    live, root, _ = _agree("broadcast_object", name, plan)
    if live.topology.size == 1:
        return obj
    return live.comm.bcast(obj, root=root)


def allgather_object(obj, name=None):
    """The list of every rank's picklable `obj`, in rank order."""
    live, _, _ = _agree("allgather_object", name, lambda name: (Request("allgather_object", name), None))
    if live.topology.size == 1:
        return [obj]
    return live.comm.allgather(obj)
