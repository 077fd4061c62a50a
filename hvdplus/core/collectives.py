"""Collectives on numpy arrays: async calls that return handles, and synchronous ones.

Each call describes itself as a `Request` (dtype, shape, op, root...) and hands it to the
engine, which runs it once every rank has submitted the same name and checked that all
requests agree. A difference raises the same exception on every rank, naming the tensor
and what each rank had; a bad argument on one rank (root out of range, wrong splits)
becomes that rank's error on every rank. The job goes on with later operations.
"""

import functools
import math
from typing import Callable, Optional, Tuple

import numpy as np

from ..comm.adasum import adasum_tree, check_power_of_two
from ..comm.reduction import apply_scale
from ..common.dtypes import dtype_name
from ..common.reduce_ops import ReduceOp, as_reduce_op
from ..engine import arguments
from ..engine.packing import grouped_request
from ..engine.handles import Handle, HandleGroup
from .process_sets import runtime_of
from ..engine.protocol import Agreement, Collective, Request
from ..engine.agreement import input_error

__all__ = [
    "input_error_async", "grouped_input_error_async", "allreduce_async", "grouped_allreduce_async",
    "allgather_async", "broadcast_async", "alltoall_async", "reducescatter_async", "poll", "synchronize",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "broadcast_object", "allgather_object", "join",
]


def _submit(kind: Collective, name: Optional[str], plan: Callable[[str, object], Tuple[Request, object]],
            process_set=None):
    """Describe the call with `plan(name, runtime)` and hand it to the engine of
    `process_set` (None: the whole job).

    An argument error is not raised here: it is submitted, so that every rank raises it."""
    runtime = runtime_of(process_set, f"{kind}()")
    name = runtime.name_for(kind, name)  # a Collective is its text: "allreduce.7"
    try:
        request, payload = plan(name, runtime)
    except (TypeError, ValueError) as exc:
        request, payload = input_error(kind, name, exc), None
    return runtime.engine.submit(request, payload)


def input_error_async(kind: str, name: Optional[str], error: Exception, process_set=None):
    """Submit an argument error an adapter found in a call of collective `kind` ("allreduce",
    ...), so that every rank raises it at synchronize (raising it on this rank alone would
    leave the others waiting for this rank's tensor)."""

    def plan(name, runtime):
        raise error

    return _submit(Collective(kind), name, plan, process_set)


def grouped_input_error_async(name: Optional[str], error: Exception, process_set=None):
    """input_error_async for a grouped all-reduce: the error is submitted under the group's
    name, which is what the other ranks submit (see groups.py)."""
    runtime = runtime_of(process_set, "grouped_allreduce()")
    return input_error_async("allreduce", runtime.name_for("grouped_allreduce", name), error, process_set)


# Module constants: an enum member looked up on its class costs more than a global name, on
# every call of the hot path below.
_ALLREDUCE = Collective.ALLREDUCE
_REDUCESCATTER = Collective.REDUCESCATTER


@functools.lru_cache(maxsize=4096)
def _reduction_agreement(dtype: str, shape: tuple, op, prescale: float, postscale: float) -> Agreement:
    """The Agreement of a reduction, made once per distinct tensor description: a training
    step describes the same tensors every step, and building a frozen dataclass of a dozen
    fields would otherwise be a sizeable part of submitting a small all-reduce."""
    return Agreement(dtype=dtype, shape=shape, reduce_op=op, prescale=prescale, postscale=postscale)


def _reduction_plan(kind, array, op, prescale_factor, postscale_factor, output=None):
    def plan(name, runtime):
        what = f"{kind} '{name}'"
        data = arguments.checked_array(array, what)
        if output is not None:
            arguments.check_output(output, data, what)
        if kind is _REDUCESCATTER:
            arguments.check_has_rows(data, what)
        op_, pre, post = arguments.reduction_arguments(data, op, prescale_factor, postscale_factor, what)
        agree = _reduction_agreement(dtype_name(data.dtype), data.shape, op_, pre, post)
        return Request(kind, name, agree), ((data, output) if kind is _ALLREDUCE else data)

    return plan


def _allgather_plan(array):
    def plan(name, runtime):
        data = arguments.checked_array(array, f"allgather '{name}'")
        arguments.check_has_rows(data, f"allgather '{name}'")
        agree = Agreement(dtype=dtype_name(data.dtype), trailing_shape=data.shape[1:])
        return Request(Collective.ALLGATHER, name, agree, rows=data.shape[0]), data

    return plan


def _broadcast_plan(array, root_rank):
    def plan(name, runtime):
        what = f"broadcast '{name}'"
        data = arguments.checked_array(array, what)
        root = _set_root(root_rank, runtime, what)
        agree = Agreement(root_rank=root, dtype=dtype_name(data.dtype), shape=data.shape)
        return Request(Collective.BROADCAST, name, agree), data

    return plan


def _set_root(root_rank, runtime, what: str) -> int:
    """The root's rank within `runtime` (a process set's runtime, or the job's): `root_rank`
    is a job rank, as in Horovod, and must belong to the set."""
    if runtime.is_job:
        return arguments.check_root_rank(root_rank, runtime.topology.size, what)
    # Any job rank may be named; set_rank_of says when it is not one of the set's.
    return runtime.set_rank_of(arguments.check_root_rank(root_rank, math.inf, what), what)


def _alltoall_plan(array, splits):
    def plan(name, runtime):
        what = f"alltoall '{name}'"
        data = arguments.checked_array(array, what)
        arguments.check_has_rows(data, what)
        send = arguments.alltoall_splits(data, splits, runtime.topology.size, what)
        agree = Agreement(dtype=dtype_name(data.dtype), trailing_shape=data.shape[1:])
        return Request(Collective.ALLTOALL, name, agree, splits=tuple(send)), data

    return plan


def _is_adasum(op) -> bool:
    try:
        return as_reduce_op(op) == ReduceOp.ADASUM
    except ValueError:
        return False  # an unknown op is reported where requests are planned, on every rank


def _adasum_async(array, name, prescale_factor, postscale_factor, output, process_set):
    """All-reduce by Adasum (hvdplus.comm.adasum): every rank's vector is gathered, and each
    rank combines them in the same tree, so all hold the same result."""
    runtime = runtime_of(process_set, "allreduce()")
    name = runtime.name_for(_ALLREDUCE, name)
    what = f"allreduce '{name}'"
    try:
        check_power_of_two(runtime.topology.size, what)
        data = arguments.checked_array(array, what)
        if data.dtype.kind != "f" and dtype_name(data.dtype) != "bfloat16":
            raise TypeError(f"{what}: Adasum needs a floating dtype, got {dtype_name(data.dtype)}")
        if output is not None:
            arguments.check_output(output, data, what)
        _, prescale, postscale = arguments.reduction_arguments(data, ReduceOp.SUM, prescale_factor, postscale_factor,
                                                               what)
    except NotImplementedError:
        raise  # the same on every rank: the size is
    except (TypeError, ValueError) as exc:
        return input_error_async("allgather", name, exc, process_set)
    row = data.reshape(1, -1)
    if prescale != 1.0:
        row = apply_scale(row, prescale, out=np.empty_like(row))

    def combine(rows):
        result = adasum_tree(rows)
        if postscale != 1.0:
            apply_scale(result, postscale)
        result = result.reshape(data.shape)
        if output is None:
            return result
        output[...] = result
        return output

    return allgather_async(row, name=name, process_set=process_set).then(combine)


def _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, outputs=None, process_set=None):
    runtime = runtime_of(process_set, "grouped_allreduce()")
    arrays = list(arrays)
    outputs = list(outputs) if outputs is not None else [None] * len(arrays)
    group = runtime.name_for("grouped_allreduce", name)
    if _is_adasum(op):  # each tensor is combined on its own
        return HandleGroup(group, [_adasum_async(array, f"{group}.{index}", prescale_factor, postscale_factor,
                                                 output, process_set)
                                   for index, (array, output) in enumerate(zip(arrays, outputs))])
    if not arrays:  # nothing to agree on: done at once, on every rank alike
        empty = Handle(group, runtime.engine)
        empty.set_result([])
        return empty
    try:
        request, payload, finish = grouped_request(
            group, arrays, outputs, op, prescale_factor, postscale_factor, runtime.algorithms.outputs,
            in_shared_memory=runtime.algorithms.engine_algorithm == "shm", size=runtime.algorithms.size)
    except (TypeError, ValueError) as exc:  # submitted, so that every rank raises it
        request, payload, finish = input_error(Collective.ALLREDUCE, group, exc), None, None
    return runtime.engine.submit(request, payload, finish)


def allreduce_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                    output=None, process_set=None):
    """Start an elementwise reduction of `array` over all ranks; returns a handle.

    Average divides the sum by size(); half types are reduced in float32. With `output`
    (a C-contiguous, writeable array of the same shape and dtype, possibly `array` itself)
    the result is written there, and the handle's result is `output`. Adasum (floating
    dtypes, a power-of-two number of ranks) combines the ranks' arrays as Horovod does.
    """
    if _is_adasum(op):
        return _adasum_async(array, name, prescale_factor, postscale_factor, output, process_set)
    plan = _reduction_plan(_ALLREDUCE, array, op, prescale_factor, postscale_factor, output=output)
    return _submit(_ALLREDUCE, name, plan, process_set)


def grouped_allreduce_async(arrays, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                            outputs=None, process_set=None):
    """Start all-reduces of `arrays` that run together, fused; the handle's result is a list.
    `outputs`, when given, holds one output array (as in allreduce_async) per array."""
    return _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, outputs, process_set)


def reducescatter_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=None):
    """Start a reduction of `array` of which rank r keeps block r of the rows (the first
    `dim0 % size` ranks get one row more)."""
    return _submit(Collective.REDUCESCATTER, name,
                   _reduction_plan(Collective.REDUCESCATTER, array, op, prescale_factor, postscale_factor),
                   process_set)


def allgather_async(array, name=None, process_set=None):
    """Start concatenating every rank's `array` along the first dimension (which may differ)."""
    return _submit(Collective.ALLGATHER, name, _allgather_plan(array), process_set)


def broadcast_async(array, root_rank=0, name=None, process_set=None):
    """Start giving every rank `root_rank`'s `array` (the others' give shape and dtype)."""
    return _submit(Collective.BROADCAST, name, _broadcast_plan(array, root_rank), process_set)


def alltoall_async(array, splits=None, name=None, process_set=None):
    """Start sending rows `splits[r]` of `array` to rank r (even split when None).

    The result is (received rows in rank order, rows received from each rank)."""
    return _submit(Collective.ALLTOALL, name, _alltoall_plan(array, splits), process_set)


def poll(handle) -> bool:
    """True when the operation behind `handle` has finished (successfully or not).

    Polling lets the engine take a step from this thread, so a loop of polls progresses."""
    return handle.poll()


def synchronize(handle):
    """Wait for `handle`'s operation and return its result, or raise its error."""
    return handle.wait()


def allreduce(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=None):
    """Elementwise reduction of `array` over all ranks (of `process_set`); every rank gets the result."""
    if _is_adasum(op):
        return _adasum_async(array, name, prescale_factor, postscale_factor, None, process_set).wait()
    plan = _reduction_plan(_ALLREDUCE, array, op, prescale_factor, postscale_factor)
    return _submit(_ALLREDUCE, name, plan, process_set).wait()


def grouped_allreduce(arrays, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=None):
    """All-reduce every array of `arrays` in one fused, atomic group; returns a list."""
    return _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, None, process_set).wait()


def reducescatter(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
                  process_set=None):
    """Reduce `array` over all ranks; rank r keeps block r of the rows."""
    plan = _reduction_plan(Collective.REDUCESCATTER, array, op, prescale_factor, postscale_factor)
    return _submit(Collective.REDUCESCATTER, name, plan, process_set).wait()


def allgather(array, name=None, process_set=None):
    """Concatenate every rank's `array` along the first dimension, which may differ per rank."""
    return _submit(Collective.ALLGATHER, name, _allgather_plan(array), process_set).wait()


def broadcast(array, root_rank=0, name=None, process_set=None):
    """Every rank gets `root_rank`'s `array` (a job rank, also on a process set)."""
    return _submit(Collective.BROADCAST, name, _broadcast_plan(array, root_rank), process_set).wait()


def alltoall(array, splits=None, name=None, process_set=None):
    """Rows `splits[r]` of `array` go to rank r; returns (received rows, rows from each rank)."""
    return _submit(Collective.ALLTOALL, name, _alltoall_plan(array, splits), process_set).wait()


def barrier(name=None, process_set=None):
    """Return once every rank (of `process_set`) has called barrier()."""
    _submit(Collective.BARRIER, name, lambda name, _: (Request(Collective.BARRIER, name), None), process_set).wait()


def broadcast_object(obj=None, root_rank=0, name=None, process_set=None):
    """`root_rank`'s picklable `obj`, on every rank."""

    def plan(name, runtime):
        root = _set_root(root_rank, runtime, f"broadcast_object '{name}'")
        return Request(Collective.BROADCAST_OBJECT, name, Agreement(root_rank=root)), obj

    return _submit(Collective.BROADCAST_OBJECT, name, plan, process_set).wait()


def allgather_object(obj, name=None, process_set=None):
    """The list of every rank's picklable `obj`, in rank order."""
    return _submit(Collective.ALLGATHER_OBJECT, name,
                   lambda name, _: (Request(Collective.ALLGATHER_OBJECT, name), obj), process_set).wait()


def join(process_set=None) -> int:
    """Declare that this rank has no more data; returns once every rank has joined.

    Until then this rank takes part in the other ranks' collectives with zeros (all-reduce,
    reducescatter) or no rows (allgather), so they complete. Average still divides by
    size(), joined ranks included. Returns the rank that joined last.
    """
    runtime = runtime_of(process_set, "join()")
    joined_last = runtime.engine.submit(Request(Collective.JOIN, "__join__"), None).wait()
    return runtime.ranks[joined_last]
