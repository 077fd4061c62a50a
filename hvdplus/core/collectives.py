"""Collectives on numpy arrays: async calls that return handles, and synchronous ones.

Each call describes itself as a `Request` (dtype, shape, op, root...) and hands it to the
engine, which runs it once every rank has submitted the same name and checked that all
requests agree. A difference raises the same exception on every rank, naming the tensor
and what each rank had; a bad argument on one rank (root out of range, wrong splits)
becomes that rank's error on every rank. The job goes on with later operations.
"""

from typing import Optional

from ..common.reduce_ops import ReduceOp, as_reduce_op
from ..common.weighted_average import weighted_buffer, weighted_result
from ..engine.agreement import input_error
from ..engine.handles import Handle, HandleGroup
from ..engine.kinds import spec_of
from ..engine.kinds.adasum import ADASUM
from ..engine.kinds.reduce import REDUCE
from ..engine.packing import grouped_request
from ..engine.protocol import Collective
from .process_sets import runtime_of

# The numpy API, which the package hvdplus exports; the adapters also use input_error_async
# and grouped_input_error_async.
__all__ = [
    "allreduce_async", "grouped_allreduce_async",
    "allgather_async", "broadcast_async", "alltoall_async", "reducescatter_async", "reduce_async", "poll",
    "synchronize", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "reduce",
    "barrier", "broadcast_object", "allgather_object", "join",
]


def _submit(kind: Collective, name: Optional[str], process_set, *call):
    """Describe the call with its kind's plan (`plan(name, runtime, *call)`) and hand it to
    the engine of `process_set` (None: the whole job).

    An argument error is not raised here: it is submitted, so that every rank raises it."""
    runtime = runtime_of(process_set, f"{kind}()")
    name = runtime.name_for(kind, name)  # a Collective is its text: "allreduce.7"
    try:
        request, payload = spec_of(kind).plan(name, runtime, *call)
    except (TypeError, ValueError) as exc:
        request, payload = input_error(kind, name, exc), None
    return runtime.engine.submit(request, payload)


def input_error_async(kind: str, name: Optional[str], error: Exception, process_set=None):
    """Submit an argument error an adapter found in a call of collective `kind` ("allreduce",
    ...), so that every rank raises it at synchronize (raising it on this rank alone would
    leave the others waiting for this rank's tensor)."""
    runtime = runtime_of(process_set, f"{kind}()")
    name = runtime.name_for(kind, name)
    return runtime.engine.submit(input_error(Collective(kind), name, error), None)


def grouped_input_error_async(name: Optional[str], error: Exception, process_set=None):
    """input_error_async for a grouped all-reduce: the error is submitted under the group's
    name, which is what the other ranks submit (see engine/packing.py)."""
    runtime = runtime_of(process_set, "grouped_allreduce()")
    return input_error_async("allreduce", runtime.name_for("grouped_allreduce", name), error, process_set)


# Module names: cheaper than attributes of a class, on every call of the hot path.
_ALLREDUCE = Collective.ALLREDUCE
_REDUCESCATTER = Collective.REDUCESCATTER


def _is_adasum(op) -> bool:
    try:
        return as_reduce_op(op) == ReduceOp.ADASUM
    except ValueError:
        return False  # an unknown op is reported where requests are planned, on every rank


def _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, outputs=None, process_set=None):
    runtime = runtime_of(process_set, "grouped_allreduce()")
    arrays = list(arrays)
    outputs = list(outputs) if outputs is not None else [None] * len(arrays)
    group = runtime.name_for("grouped_allreduce", name)
    if _is_adasum(op):  # each tensor is combined on its own
        return HandleGroup(group, [_submit(ADASUM, f"{group}.{index}", process_set, array, prescale_factor,
                                           postscale_factor, output)
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


def _weighted_average_async(array, name, op, weight, prescale_factor, postscale_factor, output, process_set):
    """A weighted average (see hvdplus/common/weighted_average.py): one Sum all-reduce of the
    weighted array and the ranks' weights, divided on every rank by the weights' total."""
    runtime = runtime_of(process_set, "allreduce()")
    name = runtime.name_for(_ALLREDUCE, name)
    try:
        if as_reduce_op(op) != ReduceOp.AVERAGE:
            raise ValueError(f"allreduce {name!r}: weight= applies to op=Average only, got op={as_reduce_op(op).label}")
        buffer = weighted_buffer(array, weight, name, runtime.topology.rank, runtime.topology.size)
    except (TypeError, ValueError) as exc:  # submitted, so that every rank raises it
        return runtime.engine.submit(input_error(_ALLREDUCE, name, exc), None)
    finish = weighted_result(array.shape, array.dtype, name, runtime.topology.size,
                             float(prescale_factor) * float(postscale_factor), output)
    return _submit(_ALLREDUCE, name, process_set, buffer, ReduceOp.SUM, 1.0, 1.0, None).then(finish)


def _weighted_grouped_average_async(arrays, name, op, weight, prescale_factor, postscale_factor, outputs,
                                    process_set):
    """A weighted average of each of `arrays` in one fused Sum all-reduce: every array's buffer
    carries the ranks' weights (a few numbers each), so each finishes as a lone one does."""
    runtime = runtime_of(process_set, "grouped_allreduce()")
    arrays = list(arrays)
    outputs = list(outputs) if outputs is not None else [None] * len(arrays)
    group = runtime.name_for("grouped_allreduce", name)
    rank, size = runtime.topology.rank, runtime.topology.size
    try:
        if as_reduce_op(op) != ReduceOp.AVERAGE:
            raise ValueError(f"grouped_allreduce {group!r}: weight= applies to op=Average only, got "
                             f"op={as_reduce_op(op).label}")
        buffers = [weighted_buffer(array, weight, f"{group}.{index}", rank, size)
                   for index, array in enumerate(arrays)]
    except (TypeError, ValueError) as exc:  # submitted under the group's name, so that every rank raises it
        return input_error_async("allreduce", group, exc, process_set)
    scale = float(prescale_factor) * float(postscale_factor)
    finishes = [weighted_result(array.shape, array.dtype, f"{group}.{index}", size, scale, output)
                for index, (array, output) in enumerate(zip(arrays, outputs))]
    handle = _grouped_allreduce(buffers, group, ReduceOp.SUM, 1.0, 1.0, None, process_set)
    return handle.then(lambda summed: [finish(buffer) for finish, buffer in zip(finishes, summed)])


def allreduce_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                    output=None, process_set=None, weight=None):
    """Start an elementwise reduction of `array` over all ranks; returns a handle.

    Average divides the sum by size(); half types are reduced in float32. With `output`
    (a C-contiguous, writeable array of the same shape and dtype, possibly `array` itself)
    the result is written there, and the handle's result is `output`. Adasum (floating
    dtypes, a power-of-two number of ranks) combines the ranks' arrays as Horovod does.

    With `weight` (op Average only; a number of 0 or more, such as this rank's sample count)
    the result is the weighted average sum_i(w_i x_i) / sum_i(w_i) of a floating `array`, in
    one all-reduce; weights that sum to zero raise ValueError on every rank.
    """
    if weight is not None:
        return _weighted_average_async(array, name, op, weight, prescale_factor, postscale_factor, output,
                                       process_set)
    if _is_adasum(op):
        return _submit(ADASUM, name, process_set, array, prescale_factor, postscale_factor, output)
    return _submit(_ALLREDUCE, name, process_set, array, op, prescale_factor, postscale_factor, output)


def grouped_allreduce_async(arrays, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                            outputs=None, process_set=None, weight=None):
    """Start all-reduces of `arrays` that run together, fused; the handle's result is a list.
    `outputs`, when given, holds one output array (as in allreduce_async) per array.
    `weight` makes each a weighted average, as in allreduce_async."""
    if weight is not None:
        return _weighted_grouped_average_async(arrays, name, op, weight, prescale_factor, postscale_factor,
                                               outputs, process_set)
    return _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, outputs, process_set)


def reducescatter_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=None):
    """Start a reduction of `array` of which rank r keeps block r of the rows (the first
    `dim0 % size` ranks get one row more)."""
    return _submit(_REDUCESCATTER, name, process_set, array, op, prescale_factor, postscale_factor)


def reduce_async(array, root_rank=0, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
                 process_set=None):
    """Start a reduction of `array` over all ranks whose result only `root_rank` (a job rank)
    gets; every other rank's handle gives back its own `array`."""
    return _submit(REDUCE, name, process_set, array, root_rank, op, prescale_factor, postscale_factor)


def allgather_async(array, name=None, process_set=None):
    """Start concatenating every rank's `array` along the first dimension (which may differ)."""
    return _submit(Collective.ALLGATHER, name, process_set, array)


def broadcast_async(array, root_rank=0, name=None, process_set=None):
    """Start giving every rank `root_rank`'s `array` (the others' give shape and dtype)."""
    return _submit(Collective.BROADCAST, name, process_set, array, root_rank)


def alltoall_async(array, splits=None, name=None, process_set=None):
    """Start sending rows `splits[r]` of `array` to rank r (even split when None).

    The result is (received rows in rank order, rows received from each rank)."""
    return _submit(Collective.ALLTOALL, name, process_set, array, splits)


def poll(handle) -> bool:
    """True when the operation behind `handle` has finished (successfully or not).

    Polling lets the engine take a step from this thread, so a loop of polls progresses."""
    return handle.poll()


def synchronize(handle):
    """Wait for `handle`'s operation and return its result, or raise its error."""
    return handle.wait()


def allreduce(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=None, weight=None):
    """Elementwise reduction of `array` over all ranks (of `process_set`); every rank gets the result.

    `weight` (with op Average) makes it the weighted average sum_i(w_i x_i) / sum_i(w_i):
    give each rank's sample count to average gradients of uneven batches exactly."""
    return allreduce_async(array, name, op, prescale_factor, postscale_factor, None, process_set, weight).wait()


def grouped_allreduce(arrays, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=None):
    """All-reduce every array of `arrays` in one fused, atomic group; returns a list."""
    return _grouped_allreduce(arrays, name, op, prescale_factor, postscale_factor, None, process_set).wait()


def reducescatter(array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
                  process_set=None):
    """Reduce `array` over all ranks; rank r keeps block r of the rows."""
    return _submit(_REDUCESCATTER, name, process_set, array, op, prescale_factor, postscale_factor).wait()


def reduce(array, root_rank=0, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0, name=None,
           process_set=None):
    """Reduce `array` over all ranks to `root_rank`, which gets the result; the others get
    their own `array` back."""
    return reduce_async(array, root_rank, op, prescale_factor, postscale_factor, name, process_set).wait()


def allgather(array, name=None, process_set=None):
    """Concatenate every rank's `array` along the first dimension, which may differ per rank."""
    return _submit(Collective.ALLGATHER, name, process_set, array).wait()


def broadcast(array, root_rank=0, name=None, process_set=None):
    """Every rank gets `root_rank`'s `array` (a job rank, also on a process set)."""
    return _submit(Collective.BROADCAST, name, process_set, array, root_rank).wait()


def alltoall(array, splits=None, name=None, process_set=None):
    """Rows `splits[r]` of `array` go to rank r; returns (received rows, rows from each rank)."""
    return _submit(Collective.ALLTOALL, name, process_set, array, splits).wait()


def barrier(name=None, process_set=None):
    """Return once every rank (of `process_set`) has called barrier()."""
    _submit(Collective.BARRIER, name, process_set).wait()


def broadcast_object(obj=None, root_rank=0, name=None, process_set=None):
    """`root_rank`'s picklable `obj`, on every rank."""
    return _submit(Collective.BROADCAST_OBJECT, name, process_set, obj, root_rank).wait()


def allgather_object(obj, name=None, process_set=None):
    """The list of every rank's picklable `obj`, in rank order."""
    return _submit(Collective.ALLGATHER_OBJECT, name, process_set, obj).wait()


def join(process_set=None) -> int:
    """Declare that this rank has no more data; returns once every rank has joined.

    Until then this rank takes part in the other ranks' collectives with zeros (all-reduce,
    reducescatter) or no rows (allgather), so they complete. Average still divides by
    size(), joined ranks included. Returns the rank that joined last.
    """
    runtime = runtime_of(process_set, "join()")
    joined_last = runtime.engine.submit(*spec_of(Collective.JOIN).plan(None, runtime)).wait()
    return runtime.ranks[joined_last]
