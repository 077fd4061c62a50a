"""Collectives on torch tensors, with Horovod's names and arguments.

Every call hands the core a numpy view of the tensor's memory; in-place variants (`_`
suffix) have the result written straight back into it. `allreduce`, `grouped_allreduce`,
`allgather`, `grouped_allgather`, `broadcast`, `alltoall`, `reducescatter` and
`grouped_reducescatter` are differentiable when an input requires grad, with the gradients
Horovod defines (each autograd Function below says which).

Every collective takes `process_set=` (default: the whole job): it then runs over that
set's ranks only, averages over their number, and splits rows among them; ranks such as
`root_rank` stay job ranks, as in Horovod. The gradient of a differentiable collective runs
over the same set. A rank outside the set gets a ValueError.
"""

import numpy as np
import torch

from ..common.reduce_ops import Average, ReduceOp, Sum, reduce_op_from
from ..common.scaling import reducescatter_gradient_factor, scale_factor
from ..common.sparse import GATHERED_OPS, divides_gathered
from ..core import collectives, runtime
from ..core.compressed_reduction import LossyCompression, finish_all
from ..core.handles import Handle, HandleGroup
from ..core.process_sets import ProcessSet, global_process_set, name_in, rank_in, size_in
from .buffers import (
    numpy_view,
    numpy_views,
    as_in_place_array,
    check_tensor,
    copy_back,
    to_tensor,
)
from .compression import Compression
from .lossy_reduction import tensor_stages

__all__ = [
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "reduce", "reduce_async", "sparse_allreduce_async",
    "join", "barrier", "poll", "synchronize",
]


def poll(handle) -> bool:
    """True once the operation behind `handle` has finished (a poll lets the engine take
    a step from this thread, so a loop of polls progresses)."""
    return handle.poll()


def synchronize(handle):
    """Wait for `handle` and return its tensor(s), or raise its error (a callable, such as
    sparse_allreduce_async returns, is called)."""
    return handle() if callable(handle) else handle.wait()


def _what(kind, name):
    return f"{kind} '{name}'" if name else kind


def _checked(kind, name, tensors, process_set, in_place=False):
    """None when the tensors are usable, else a handle that fails on every rank of
    `process_set`."""
    try:
        for tensor in tensors:
            check_tensor(tensor, _what(kind, name), in_place)
    except (TypeError, ValueError) as error:
        return collectives.input_error_async(kind, name, error, process_set)
    return None


def _grouped_arrays(name, tensors, process_set, in_place=False):
    """The group's arrays (buffers.numpy_views), or a handle that fails on every rank."""
    try:
        return numpy_views(tensors, _what("grouped_allreduce", name), in_place)
    except (TypeError, ValueError) as error:
        return collectives.grouped_input_error_async(name, error, process_set)


def _differentiable(*tensors):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _forward_name(kind, name, process_set):
    """The forward collective's name, resolved now, so that its gradient collective can be
    named from it ("<name>.grad"): call order then names only the forward, and a gradient's
    name cannot differ between ranks however autograd orders the backward pass."""
    return name_in(process_set, kind, name, f"{kind}()")


def _check_gradient_op(kind, op):
    """Only Sum and Average have a gradient: RuntimeError for the others."""
    if op not in (Average, Sum):
        raise RuntimeError(f"{kind} with op {ReduceOp(op).label} has no gradient; use Sum or Average")


# -- all-reduce ---------------------------------------------------------------------------
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set, weight=None):
    """Start an all-reduce of `tensor`; synchronize returns a new tensor.

    `weight` (op Average only; a number of 0 or more, such as this rank's sample count) makes
    it the weighted average sum_i(w_i x_i) / sum_i(w_i) (hvdplus.allreduce's `weight`)."""
    failed = _checked("allreduce", name, [tensor], process_set)
    if failed:
        return failed
    core = collectives.allreduce_async(numpy_view(tensor), name, reduce_op_from(average, op),
                                       prescale_factor, postscale_factor, process_set=process_set,
                                       weight=_number(weight))
    return core.then(lambda result: to_tensor(result, tensor))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set, weight=None):
    """Start an in-place all-reduce of `tensor`; synchronize returns `tensor`. `weight` as
    in allreduce_async."""
    failed = _checked("allreduce", name, [tensor], process_set, in_place=True)
    if failed:
        return failed
    array, finish = as_in_place_array(tensor)
    core = collectives.allreduce_async(array, name, reduce_op_from(average, op), prescale_factor, postscale_factor,
                                       output=array, process_set=process_set, weight=_number(weight))
    return core.then(lambda _: finish())


def _number(weight):
    """A weight given as a one-element tensor (a count computed on the device) or a numpy
    scalar as a Python number, so that every kind of number takes the same, differentiable
    path on every rank; anything else goes to the core as it is, which checks it on every rank."""
    if isinstance(weight, torch.Tensor) and weight.numel() == 1:
        return weight.item()
    if isinstance(weight, np.generic) and weight.size == 1:
        return weight.item()
    return weight


def _allreduce_plain(tensor, name, op, prescale_factor, postscale_factor, compression, process_set, weight=None):
    if isinstance(compression, LossyCompression):
        return _allreduce_lossy(tensor, name, op, prescale_factor, postscale_factor, compression, process_set, weight)
    wire, ctx = compression.compress(tensor)
    reduced = allreduce_async(wire, None, name, op, prescale_factor, postscale_factor, process_set, weight).wait()
    return compression.decompress(reduced, ctx)


def _allreduce_lossy(tensor, name, op, prescale_factor, postscale_factor, compression, process_set, weight):
    """An all-reduce with Compression.int8, .topk or .powersgd, without memory: no error
    feedback, and PowerSGD starts from its seeded Q each call (see docs/compression.md)."""
    if weight is not None or op not in (Average, Sum):
        raise ValueError(f"allreduce '{name}' with compression={compression!r} takes op Average or Sum, unweighted")
    result = tensor.detach().clone(memory_format=torch.contiguous_format)
    factor = scale_factor(op, prescale_factor, postscale_factor, size_in(process_set, "allreduce"))
    finish_all([tensor_stages(compression, result, name, None, factor, process_set)])
    return result


class _AllreduceFunction(torch.autograd.Function):
    """The gradient of an all-reduce is the same all-reduce of the incoming gradients."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression, process_set):
        name = _forward_name("adasum" if op == ReduceOp.ADASUM else "allreduce", name, process_set)
        ctx.name, ctx.reduction = name, (op, prescale_factor, postscale_factor, compression, process_set)
        return _allreduce_plain(tensor, name, op, prescale_factor, postscale_factor, compression, process_set)

    @staticmethod
    def backward(ctx, grad):
        _check_gradient_op("allreduce", ctx.reduction[0])
        reduced = _allreduce_plain(grad.contiguous(), f"{ctx.name}.grad", *ctx.reduction)
        return reduced, None, None, None, None, None, None


class _WeightedAverageFunction(torch.autograd.Function):
    """y = sum_j(w_j x_j) / W on every rank, W = sum_j(w_j): the gradient of the ranks' summed
    losses with respect to this rank's x is (w_i / W) times the sum of every rank's incoming
    gradient. One Sum all-reduce of those gradients with this rank's weight appended gives
    both the sum and W."""

    @staticmethod
    def forward(ctx, tensor, name, weight, prescale_factor, postscale_factor, compression, process_set):
        name = _forward_name("allreduce", name, process_set)
        ctx.name, ctx.weight = name, float(weight)
        ctx.scale, ctx.process_set = float(prescale_factor) * float(postscale_factor), process_set
        return _allreduce_plain(tensor, name, Average, prescale_factor, postscale_factor, compression, process_set,
                                weight)

    @staticmethod
    def backward(ctx, grad):
        wire = torch.cat([grad.reshape(-1).to(torch.float64), grad.new_full((1,), ctx.weight, dtype=torch.float64)])
        summed = allreduce_async(wire.cpu(), None, f"{ctx.name}.grad", Sum, process_set=ctx.process_set).wait()
        share = ctx.weight / summed[-1].item() * ctx.scale if summed[-1].item() > 0 else 0.0
        reduced = (summed[:-1] * share).reshape(grad.shape).to(dtype=grad.dtype, device=grad.device)
        return reduced, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, weight=None):
    """All-reduce `tensor` into a new tensor (Average by default); differentiable.

    With `weight` (op Average only; a number of 0 or more, such as this rank's sample count)
    the result is the weighted average sum_i(w_i x_i) / sum_i(w_i), for averaging gradients or
    metrics of uneven batches; a weight with another op raises ValueError on every rank."""
    op = reduce_op_from(average, op)
    weight = _number(weight)
    if weight is not None:
        if _differentiable(tensor) and op == Average and isinstance(weight, (int, float)):
            return _WeightedAverageFunction.apply(tensor, name, weight, prescale_factor, postscale_factor,
                                                  compression, process_set)
        return _allreduce_plain(tensor, name, op, prescale_factor, postscale_factor, compression, process_set,
                                weight)
    if _differentiable(tensor):
        return _AllreduceFunction.apply(tensor, name, op, prescale_factor, postscale_factor, compression,
                                        process_set)
    return _allreduce_plain(tensor, name, op, prescale_factor, postscale_factor, compression, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """All-reduce `tensor` in place; returns it."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Start all-reduces of `tensors` as one fused group; synchronize returns new tensors."""
    tensors = list(tensors)
    arrays = _grouped_arrays(name, tensors, process_set)
    if isinstance(arrays, Handle):
        return arrays
    core = collectives.grouped_allreduce_async(arrays, name, reduce_op_from(average, op),
                                               prescale_factor, postscale_factor, process_set=process_set)
    return core.then(lambda results: [to_tensor(r, t) for r, t in zip(results, tensors)])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set, weight=None):
    """Start in-place all-reduces of `tensors` as one fused group. `weight` makes each a
    weighted average, as in allreduce_async."""
    tensors = list(tensors)
    arrays = _grouped_arrays(name, tensors, process_set, in_place=True)
    if isinstance(arrays, Handle):
        return arrays
    # Host copies of CUDA tensors go back once reduced; CPU tensors were reduced where they lie.
    staged = [(array, tensor) for array, tensor in zip(arrays, tensors) if not tensor.is_cpu]
    core = collectives.grouped_allreduce_async(arrays, name, reduce_op_from(average, op), prescale_factor,
                                               postscale_factor, outputs=arrays, process_set=process_set,
                                               weight=_number(weight))

    def finish(_):
        for array, tensor in staged:
            copy_back(array, tensor)
        return tensors

    return core.then(finish)


def _grouped_allreduce_plain(tensors, name, op, prescale_factor, postscale_factor, compression, process_set):
    compressed = [compression.compress(t) for t in tensors]
    reduced = grouped_allreduce_async([w for w, _ in compressed], None, name, op, prescale_factor, postscale_factor,
                                      process_set).wait()
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


class _GroupedAllreduceFunction(torch.autograd.Function):
    """The gradient of a grouped all-reduce is the same grouped all-reduce of the incoming
    gradients."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, compression, process_set, *tensors):
        ctx.name = _forward_name("grouped_allreduce", name, process_set)
        ctx.reduction = (op, prescale_factor, postscale_factor, compression, process_set)
        return tuple(_grouped_allreduce_plain(tensors, ctx.name, *ctx.reduction))

    @staticmethod
    def backward(ctx, *grads):
        _check_gradient_op("grouped_allreduce", ctx.reduction[0])
        reduced = _grouped_allreduce_plain([g.contiguous() for g in grads], f"{ctx.name}.grad", *ctx.reduction)
        return (None,) * 6 + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """All-reduce `tensors` as one fused group; returns new tensors; differentiable."""
    tensors, op = list(tensors), reduce_op_from(average, op)
    if _differentiable(*tensors):
        return list(_GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor, compression,
                                                    process_set, *tensors))
    return _grouped_allreduce_plain(tensors, name, op, prescale_factor, postscale_factor, compression, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """All-reduce `tensors` in place as one fused group; returns them."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                    process_set).wait()


# -- allgather ----------------------------------------------------------------------------
def reduce_async(tensor, root_rank=0, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                 process_set=global_process_set):
    """Start a reduction of `tensor` (Average by default) whose result only `root_rank` (a job
    rank) gets; synchronize returns a new tensor there, and `tensor` itself elsewhere."""
    failed = _checked("reduce", name, [tensor], process_set)
    if failed:
        return failed
    array = numpy_view(tensor)
    core = collectives.reduce_async(array, root_rank, reduce_op_from(None, op), prescale_factor, postscale_factor,
                                    name, process_set)
    return core.then(lambda result: tensor if result is array else to_tensor(result, tensor))


def reduce(tensor, root_rank=0, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
           process_set=global_process_set):
    """Reduce `tensor` over the ranks to `root_rank`, which gets a new tensor; the other
    ranks get `tensor` back. Not differentiable."""
    return reduce_async(tensor, root_rank, name, op, prescale_factor, postscale_factor, process_set).wait()


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's `tensor` along dimension 0 (which may differ)."""
    failed = _checked("allgather", name, [tensor], process_set)
    if failed:
        return failed
    core = collectives.allgather_async(numpy_view(tensor), name, process_set=process_set)
    return core.then(lambda result: to_tensor(result, tensor))


def _gathered(tensors, name, grouped, process_set):
    """Every rank's `tensors` concatenated: one allgather named `name`, or a group of them."""
    if grouped:
        return grouped_allgather_async(tensors, name, process_set).wait()
    return [allgather_async(tensors[0], name, process_set).wait()]


class _AllgatherFunction(torch.autograd.Function):
    """Each rank's input gets its own rows of the ranks' average incoming gradient (Horovod's
    gradients of allgather and broadcast take each rank's loss as its share of one mean)."""

    @staticmethod
    def forward(ctx, name, grouped, process_set, *tensors):
        ctx.name = _forward_name("grouped_allgather" if grouped else "allgather", name, process_set)
        gathered = _gathered(list(tensors), ctx.name, grouped, process_set)
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(gathered)

    @staticmethod
    def backward(ctx, *grads):
        process_set = ctx.process_set
        averaged = grouped_allreduce_async([g.contiguous() for g in grads], name=f"{ctx.name}.grad", op=Average,
                                           process_set=process_set)
        every_rows = collectives.allgather(np.array([ctx.rows], dtype=np.int64), name=f"{ctx.name}.grad_rows",
                                           process_set=process_set)
        starts = every_rows[:rank_in(process_set, "allgather()")].sum(axis=0)
        mine = [g[int(start):int(start) + rows] for g, start, rows in zip(averaged.wait(), starts, ctx.rows)]
        return (None, None, None, *mine)


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along dimension 0; differentiable."""
    if _differentiable(tensor):
        return _AllgatherFunction.apply(name, False, process_set, tensor)[0]
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathers of several tensors; synchronize returns a list."""
    tensors = list(tensors)
    base = name_in(process_set, "grouped_allgather", name, "grouped_allgather()")
    handles = [allgather_async(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)]
    return HandleGroup(base, handles)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgather each of `tensors`; returns a list; differentiable."""
    tensors = list(tensors)
    if _differentiable(*tensors):
        return list(_AllgatherFunction.apply(name, True, process_set, *tensors))
    return grouped_allgather_async(tensors, name, process_set).wait()


# -- broadcast ----------------------------------------------------------------------------
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start broadcasting `root_rank`'s `tensor` (a job rank, in `process_set`);
    synchronize returns a new tensor."""
    failed = _checked("broadcast", name, [tensor], process_set)
    if failed:
        return failed
    core = collectives.broadcast_async(numpy_view(tensor), root_rank, name, process_set=process_set)
    return core.then(lambda result: to_tensor(result, tensor))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Start broadcasting `root_rank`'s `tensor` into every rank's `tensor`."""
    failed = _checked("broadcast", name, [tensor], process_set, in_place=True)
    if failed:
        return failed
    array, finish = as_in_place_array(tensor)

    def write_back(result):
        np.copyto(array, result, casting="no")
        return finish()

    core = collectives.broadcast_async(array, root_rank, name, process_set=process_set)
    return core.then(write_back)


class _BroadcastFunction(torch.autograd.Function):
    """The root's input gets the ranks' average incoming gradient; the others get zeros."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.name = _forward_name("broadcast", name, process_set)
        ctx.is_root, ctx.process_set = runtime.rank() == root_rank, process_set  # job ranks both
        return broadcast_async(tensor, root_rank, ctx.name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        averaged = _allreduce_plain(grad.contiguous(), f"{ctx.name}.grad", Average, 1.0, 1.0, Compression.none,
                                    ctx.process_set)
        return (averaged if ctx.is_root else torch.zeros_like(averaged)), None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """`root_rank`'s `tensor` on every rank, as a new tensor; differentiable."""
    if _differentiable(tensor):
        return _BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite every rank's `tensor` with `root_rank`'s; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


# -- alltoall and reducescatter ------------------------------------------------------------
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending rows `splits[r]` of `tensor` to the r-th rank of `process_set` (even
    split when None)."""
    failed = _checked("alltoall", name, [tensor], process_set)
    if failed:
        return failed
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    core = collectives.alltoall_async(numpy_view(tensor), splits, name, process_set=process_set)
    return core.then(lambda result: (to_tensor(result[0], tensor), torch.from_numpy(result[1])))


class _AlltoallFunction(torch.autograd.Function):
    """Each row's gradient goes back to the rank that sent the row."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.name = _forward_name("alltoall", name, process_set)
        received, received_splits = alltoall_async(tensor, splits, ctx.name, process_set).wait()
        ctx.received_splits, ctx.process_set = received_splits, process_set
        ctx.mark_non_differentiable(received_splits)
        return received, received_splits

    @staticmethod
    def backward(ctx, grad, _):
        returned, _ = alltoall_async(grad.contiguous(), ctx.received_splits, f"{ctx.name}.grad",
                                     ctx.process_set).wait()
        return returned, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows received from every rank, in rank order; differentiable. As in Horovod, with
    `splits` given it returns (those rows, rows received from each rank), and without them
    the rows alone. (`alltoall_async` + `synchronize` always give the pair.)"""
    if _differentiable(tensor):
        received, received_splits = _AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        received, received_splits = alltoall_async(tensor, splits, name, process_set).wait()
    return received if splits is None else (received, received_splits)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Start a reduction of which this rank keeps its block of rows."""
    failed = _checked("reducescatter", name, [tensor], process_set)
    if failed:
        return failed
    core = collectives.reducescatter_async(numpy_view(tensor), name, op, prescale_factor, postscale_factor,
                                           process_set=process_set)
    return core.then(lambda result: to_tensor(result, tensor))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Start reduce-scatters of several tensors; synchronize returns a list."""
    tensors = list(tensors)
    base = name_in(process_set, "grouped_reducescatter", name, "grouped_reducescatter()")
    handles = [reducescatter_async(t, f"{base}.{i}", op, process_set, prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return HandleGroup(base, handles)


def _scattered(tensors, name, grouped, op, process_set, prescale_factor, postscale_factor, compression):
    """This rank's block of each of `tensors` reduced: one reducescatter named `name`, or a
    group of them."""
    compressed = [compression.compress(t) for t in tensors]
    wires = [w for w, _ in compressed]
    if grouped:
        blocks = grouped_reducescatter_async(wires, name, op, process_set, prescale_factor, postscale_factor).wait()
    else:
        blocks = [reducescatter_async(wires[0], name, op, process_set, prescale_factor, postscale_factor).wait()]
    return [compression.decompress(block, ctx) for block, (_, ctx) in zip(blocks, compressed)]


class _ReducescatterFunction(torch.autograd.Function):
    """Horovod's gradient: every rank's incoming gradient gathered, times the factor
    common.scaling.reducescatter_gradient_factor gives (the scale factors, and the set's size
    for Sum), as hvdplus.tensorflow's is."""

    @staticmethod
    def forward(ctx, name, grouped, op, process_set, prescale_factor, postscale_factor, compression, *tensors):
        ctx.name = _forward_name("grouped_reducescatter" if grouped else "reducescatter", name, process_set)
        blocks = _scattered(list(tensors), ctx.name, grouped, op, process_set, prescale_factor, postscale_factor,
                            compression)
        ctx.op, ctx.scales, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return tuple(blocks)

    @staticmethod
    def backward(ctx, *grads):
        _check_gradient_op("reducescatter", ctx.op)
        factor = reducescatter_gradient_factor(ctx.op, *ctx.scales, size_in(ctx.process_set, "reducescatter()"))
        gathered = grouped_allgather_async([(g * factor).contiguous() for g in grads], f"{ctx.name}.grad",
                                           ctx.process_set)
        return (None,) * 7 + tuple(gathered.wait())


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce `tensor` over ranks; the r-th rank of `process_set` keeps block r of the rows;
    differentiable."""
    arguments = (name, False, op, process_set, prescale_factor, postscale_factor, compression)
    if _differentiable(tensor):
        return _ReducescatterFunction.apply(*arguments, tensor)[0]
    return _scattered([tensor], *arguments)[0]


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce-scatter each of `tensors`; returns a list; differentiable."""
    tensors = list(tensors)
    arguments = (name, True, op, process_set, prescale_factor, postscale_factor, compression)
    if _differentiable(*tensors):
        return list(_ReducescatterFunction.apply(*arguments, *tensors))
    return _scattered(tensors, *arguments)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Start reducing a sparse COO `tensor` as Horovod does: its indices and values are
    allgathered (values divided by the set's size for Average), which sums duplicates
    when the result is coalesced. Returns a callable that waits and gives the sparse
    result; `synchronize` accepts it too."""
    op = reduce_op_from(None, op)
    if op not in GATHERED_OPS:
        raise ValueError(f"sparse_allreduce_async '{name}': op must be Average or Sum, not {ReduceOp(op).label}")
    indices = allgather_async(tensor._indices().t().contiguous(), f"{name}.indices", process_set)
    values = allgather_async(tensor._values().contiguous(), f"{name}.values", process_set)

    def result():
        gathered_values = values.wait()
        if divides_gathered(op):
            gathered_values = gathered_values / size_in(process_set, "sparse_allreduce_async()")
        return torch.sparse_coo_tensor(indices.wait().t(), gathered_values, tensor.shape, check_invariants=True)

    return result


def join(device=-1, process_set=global_process_set) -> int:
    """This rank is out of data; see hvdplus.join. Returns the (job) rank that joined last.

    `device` is accepted for Horovod's signature: Horovod makes the zero tensors a joined
    rank contributes on it; hvdplus's are host arrays whatever the device."""
    if isinstance(device, ProcessSet):  # join(process_set) positionally, as hvdplus took it
        device, process_set = -1, device
    return collectives.join(process_set=process_set)


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank (of `process_set`) has called barrier()."""
    collectives.barrier(process_set=process_set)
