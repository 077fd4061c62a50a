"""Collectives on TensorFlow tensors, with Horovod's names and arguments.

Each works on eager tensors and inside tf.function (see buffers.run_on_host). These have
gradients, so a model may call them in its forward pass:

    allreduce, grouped_allreduce   the same all-reduce of the upstream gradient (Sum, Average)
    allgather                      the average over ranks of the rows this rank contributed
    broadcast                      on the root, the average over ranks; zeros elsewhere
    alltoall                       the upstream rows sent back where they came from
    reducescatter                  the upstream blocks allgathered, times the scale factors and
                                   size() for Sum (common.scaling.reducescatter_gradient_factor)

(the gradients Horovod defines: each rank's loss is taken as its share of one mean).

Each takes `process_set=` (hvdplus.ProcessSet; the whole job by default): the collective, and
its gradient, run over the ranks of that set only, which must all call it; ranks (broadcast
roots, join's answer) are job ranks, as in Horovod. A rank outside the set gets Horovod's
tf.errors.InvalidArgumentError (a ValueError too) when it calls the collective, or when
tf.function traces it; a set hvdplus does not hold (removed, or a forged id) a ValueError.

tf.IndexedSlices (the gradients of tf.gather and of embeddings) are all-reduced as Horovod
does: every rank's values and indices are gathered, and repeated indices add up where the
slices are applied; Average divides the values by the size. As in Horovod, other ops and
scale factors raise NotImplementedError for them. Inside a graph an error (a mismatch
between ranks, a bad argument) surfaces as the tf.errors.OpError that TensorFlow makes of
the Python exception, with its message.
"""

import numpy as np
import tensorflow as tf

from ..common.reduce_ops import Adasum, Average, Sum, as_reduce_op, reduce_op_from
from ..common.scaling import reducescatter_gradient_factor
from ..common.sparse import GATHERED_OPS, divides_gathered
from ..core import collectives, runtime
from ..core.process_sets import global_process_set, rank_in, size_in
from .buffers import as_tensor, run_on_host
from .collective_names import collective_name, require_member, what
from .compression import Compression

__all__ = [
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
    "alltoall", "reducescatter", "grouped_reducescatter", "reduce", "join", "barrier",
]


def _fail_everywhere(error, submitted, process_set, dtype=tf.float32):
    """Raise `error`, found on this rank, on every rank of `process_set`: eagerly now, in a
    graph when this op runs, where the other ranks run the collectives `submitted` ((kind,
    name) pairs) names."""

    def fail():
        handles = [collectives.input_error_async(kind, name, error, process_set) for kind, name in submitted]
        for handle in handles:
            handle.wait()

    return run_on_host(fail, [], [dtype], [None])[0]


def _group_names(name, tensors):
    """What a group submits: one all-reduce `name` of its dense tensors packed together (see
    hvdplus/engine/packing.py) and two allgathers for each IndexedSlices."""
    dense = sum(1 for t in tensors if not isinstance(t, tf.IndexedSlices))
    slices = len(tensors) - dense
    return ([("allreduce", name)] if dense else []) + (
        [("allgather", f"{name}.slices.{j}.{part}") for j in range(slices) for part in ("values", "indices")])


def _check_differentiable(kind, op):
    if op not in (Average, Sum):
        raise RuntimeError(f"{kind} with op {op.label} has no gradient; use Sum or Average")


def _set_size(process_set) -> int:
    """How many ranks `process_set` has (the job's for the global set)."""
    return size_in(process_set, "process_set.size()")


def _rows_shape(shape: tf.TensorShape) -> tf.TensorShape:
    """`shape` with its first dimension unknown (unknown altogether for scalars)."""
    if shape.rank is None or shape.rank == 0:
        return tf.TensorShape(None)
    return tf.TensorShape([None]).concatenate(shape[1:])


# -- all-reduce ---------------------------------------------------------------------------
def _host_allreduce(tensor, name, op, prescale, postscale, process_set):
    def reduce(array):
        return [collectives.allreduce(array, op, prescale, postscale, name, process_set)]

    return run_on_host(reduce, [tensor], [tensor.dtype], [tensor.shape])[0]


def _allreduce(tensor, name, op, prescale, postscale, process_set):
    @tf.custom_gradient
    def reduce(x):
        def grad(upstream):
            _check_differentiable("allreduce", op)
            return _allreduce(upstream, f"{name}.grad", op, prescale, postscale, process_set)

        return _host_allreduce(x, name, op, prescale, postscale, process_set), grad

    return reduce(tensor)


def _weight_tensor(weight, name) -> tf.Tensor:
    """`weight` as a float64 tensor; ValueError, for every rank to raise, where it is none."""
    try:
        return tf.cast(weight, tf.float64)
    except (TypeError, ValueError, tf.errors.OpError) as error:
        raise ValueError(f"allreduce {name!r}: weight {weight!r} is not a number or a numeric tensor "
                         f"({type(error).__name__})") from None


def _weighted_average(tensor, weight, name, op, prescale, postscale, process_set):
    """sum_i(w_i x_i) / sum_i(w_i) over the ranks (hvdplus.allreduce's `weight`). Its gradient
    with respect to this rank's x is (w_i / W) times the sum of every rank's upstream
    gradient: one Sum all-reduce of that gradient with w_i appended gives both."""
    weight = tf.cast(weight, tf.float64)

    def reduce_on_host(array, weight_array):
        return [collectives.allreduce(array, op, prescale, postscale, name, process_set, weight=weight_array)]

    @tf.custom_gradient
    def reduce(x):
        def grad(upstream):
            wire = tf.concat([tf.reshape(tf.cast(upstream, tf.float64), [-1]), tf.reshape(weight, [1])], 0)
            summed = _host_allreduce(wire, f"{name}.grad", Sum, 1.0, 1.0, process_set)
            share = tf.math.divide_no_nan(weight, summed[-1]) * (prescale * postscale)
            return tf.cast(tf.reshape(summed[:-1] * share, tf.shape(upstream)), upstream.dtype)

        return run_on_host(reduce_on_host, [x, weight], [x.dtype], [x.shape])[0], grad

    return reduce(tensor)


def allreduce(tensor, average=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set, weight=None):
    """`tensor` reduced over all ranks (Average by default): `postscale * reduce(prescale * x)`.

    Args:
        tensor: a tensor (or anything tf.convert_to_tensor takes), or tf.IndexedSlices.
        average: Horovod's deprecated flag; True is op=Average, False op=Sum.
        compression: Compression.none, .fp16 or .bf16 for the values on the wire.
        op: Average, Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's tensor before the reduction.
        postscale_factor: multiplies the result after it.
        name: the name every rank gives this collective (default: eagerly one by call order, in
            a graph one by the op's place in it).
        process_set: the ranks that reduce (Average divides by its size); the whole job by default.
        weight: with op Average, this rank's weight (a number or scalar tensor of 0 or more, such
            as its sample count): the result is sum_i(w_i x_i) / sum_i(w_i), for gradients or
            metrics of uneven batches. A weight with another op, or weights that sum to zero,
            raise on every rank.
    """
    name = collective_name("allreduce", name, process_set)
    if weight is not None:
        try:
            if isinstance(tensor, tf.IndexedSlices):
                raise ValueError(f"{what('allreduce', name)}: weight= takes a dense tensor, not tf.IndexedSlices")
            op = as_reduce_op(reduce_op_from(average, op))
            tensor = as_tensor(tensor, what("allreduce", name))
            weight = _weight_tensor(weight, name)
        except (TypeError, ValueError) as error:
            return _fail_everywhere(error, [("allreduce", name)], process_set)
        wire, ctx = compression.compress(tensor)
        return compression.decompress(
            _weighted_average(wire, weight, name, op, prescale_factor, postscale_factor, process_set), ctx)
    if isinstance(tensor, tf.IndexedSlices):
        return grouped_allreduce([tensor], average, compression, op, prescale_factor, postscale_factor, name,
                                 process_set)[0]
    try:
        op = as_reduce_op(reduce_op_from(average, op))
        tensor = as_tensor(tensor, what("allreduce", name))
    except (TypeError, ValueError) as error:
        return _fail_everywhere(error, [("allreduce", name)], process_set)
    wire, ctx = compression.compress(tensor)
    return compression.decompress(_allreduce(wire, name, op, prescale_factor, postscale_factor, process_set), ctx)


def _check_slices(name, op, prescale, postscale):
    """NotImplementedError where Horovod raises one for tf.IndexedSlices, which are gathered
    rather than reduced (repeated indices add up where the slices are applied): for an op
    other than Sum and Average, and for scale factors."""
    if op == Adasum:
        raise NotImplementedError(
            f"{what('allreduce', name)}: the Adasum reduction does not currently support sparse tensors. "
            "As a workaround please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in GATHERED_OPS:
        raise NotImplementedError(f"{what('allreduce', name)}: tf.IndexedSlices are gathered, which only ops Sum "
                                  f"and Average can stand for, not {op.label}; convert them to a dense tensor first")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError(f"{what('allreduce', name)}: tf.IndexedSlices take no prescale_factor or "
                                  "postscale_factor; convert them to a dense tensor first")


def _reduce_group(dense, slices, name, op, prescale, postscale, process_set):
    """One host op: `dense` all-reduced as one fused group, and every IndexedSlices' values
    and indices allgathered. Returns (reduced tensors, gathered IndexedSlices)."""
    count = len(dense)
    gather_names = [gather_name for _, gather_name in _group_names(name, slices)]
    inputs = list(dense)
    for piece in slices:
        inputs += [piece.values, piece.indices]

    def reduce(*arrays):
        group = (collectives.grouped_allreduce_async(arrays[:count], name, op, prescale, postscale,
                                                     process_set=process_set) if count else None)
        gathers = [collectives.allgather_async(array, gather_name, process_set)
                   for array, gather_name in zip(arrays[count:], gather_names)]
        return (group.wait() if count else []) + [gather.wait() for gather in gathers]

    shapes = [tensor.shape for tensor in dense] + [_rows_shape(tensor.shape) for tensor in inputs[count:]]
    outputs = run_on_host(reduce, inputs, [tensor.dtype for tensor in inputs], shapes)
    gathered = []
    for index, piece in enumerate(slices):
        values, indices = outputs[count + 2 * index:count + 2 * index + 2]
        if divides_gathered(op):
            # As Horovod divides: in the values' dtype, so integers become TensorFlow's
            # quotient of integers (float64 for int32 and int64), whatever the size.
            values = values / tf.cast(_set_size(process_set), values.dtype)
        gathered.append(tf.IndexedSlices(values, indices, piece.dense_shape))
    return outputs[:count], gathered


def _grouped_allreduce(tensors, name, op, prescale, postscale, process_set):
    @tf.custom_gradient
    def reduce(*xs):
        def grad(*upstream):
            _check_differentiable("grouped_allreduce", op)
            return _grouped_allreduce(list(upstream), f"{name}.grad", op, prescale, postscale, process_set)

        return _reduce_group(list(xs), [], name, op, prescale, postscale, process_set)[0], grad

    return reduce(*tensors)


def _weighted_group(wires, weight, name, op, prescale, postscale, process_set):
    """One host op: each of `wires` averaged over the ranks weighted by `weight`, fused."""
    def reduce(weight_array, *arrays):
        return collectives.grouped_allreduce_async(list(arrays), name, op, prescale, postscale,
                                                   process_set=process_set, weight=weight_array).wait()

    return run_on_host(reduce, [tf.cast(weight, tf.float64), *wires], [w.dtype for w in wires],
                       [w.shape for w in wires])


def grouped_allreduce(tensors, average=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, name=None, process_set=global_process_set, weight=None):
    """All-reduce `tensors` in one host op: the dense ones as one fused group (differentiable
    when all are dense), IndexedSlices by allgather. Arguments as in allreduce; returns a list.

    With `weight` (as in allreduce) each becomes the weighted average sum_i(w_i x_i) /
    sum_i(w_i); IndexedSlices are made dense for it. That form has no gradient."""
    name = collective_name("grouped_allreduce", name, process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    if weight is not None:
        try:
            op = as_reduce_op(reduce_op_from(average, op))
            tensors = [as_tensor(tf.convert_to_tensor(t) if isinstance(t, tf.IndexedSlices) else t,
                                 what("grouped_allreduce", name)) for t in tensors]
            weight = _weight_tensor(weight, name)
        except (TypeError, ValueError) as error:
            # The others submit one all-reduce: their IndexedSlices are made dense here too.
            return [_fail_everywhere(error, [("allreduce", name)], process_set)] * len(tensors)
        compressed = [compression.compress(t) for t in tensors]
        reduced = _weighted_group([wire for wire, _ in compressed], weight, name, op, prescale_factor,
                                  postscale_factor, process_set)
        return [compression.decompress(value, ctx) for value, (_, ctx) in zip(reduced, compressed)]
    try:
        op = as_reduce_op(reduce_op_from(average, op))
        tensors = [t if isinstance(t, tf.IndexedSlices) else as_tensor(t, what("grouped_allreduce", name))
                   for t in tensors]
    except (TypeError, ValueError) as error:
        return [_fail_everywhere(error, _group_names(name, tensors), process_set)] * len(tensors)
    slices = [t for t in tensors if isinstance(t, tf.IndexedSlices)]
    if slices:
        _check_slices(name, op, prescale_factor, postscale_factor)
    dense = [(i, compression.compress(t)) for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    wires = [wire for _, (wire, _) in dense]
    if slices:
        reduced, gathered = _reduce_group(wires, slices, name, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced, gathered = _grouped_allreduce(wires, name, op, prescale_factor, postscale_factor, process_set), []
    results = [None] * len(tensors)
    for (i, (_, ctx)), value in zip(dense, reduced):
        results[i] = compression.decompress(value, ctx)
    for i, value in zip([i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)], gathered):
        results[i] = value
    return results


# -- allgather ----------------------------------------------------------------------------
def _host_allgather(tensor, name, process_set):
    def gather(array):
        return [collectives.allgather(array, name, process_set)]

    return run_on_host(gather, [tensor], [tensor.dtype], [_rows_shape(tensor.shape)])[0]


def _allgather(tensor, name, process_set):
    @tf.custom_gradient
    def gather(x):
        def grad(upstream):
            averaged = _allreduce(upstream, f"{name}.grad", Average, 1.0, 1.0, process_set)
            rows = _host_allgather(tf.shape(x, out_type=tf.int64)[:1], f"{name}.grad.rows", process_set)
            rank = rank_in(process_set, "allgather()")  # this rank's place in the set
            start = tf.reduce_sum(rows[:rank])
            return averaged[start:start + rows[rank]]

        return _host_allgather(x, name, process_set), grad

    return gather(tensor)


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension, which may differ per
    rank, in the order of the ranks of `process_set`."""
    name = collective_name("allgather", name, process_set)
    try:
        tensor = as_tensor(tensor, what("allgather", name))
    except TypeError as error:
        return _fail_everywhere(error, [("allgather", name)], process_set)
    return _allgather(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgather each of `tensors` (named `name.0`, `name.1`...); returns a list."""
    base = collective_name("grouped_allgather", name, process_set)
    return [allgather(tensor, f"{base}.{index}", process_set) for index, tensor in enumerate(tensors)]


# -- broadcast ----------------------------------------------------------------------------
def _host_broadcast(tensor, root_rank, name, process_set):
    def give(array):
        return [collectives.broadcast(array, root_rank, name, process_set)]

    return run_on_host(give, [tensor], [tensor.dtype], [tensor.shape])[0]


def _broadcast(tensor, root_rank, name, process_set):
    @tf.custom_gradient
    def give(x):
        def grad(upstream):
            averaged = _allreduce(upstream, f"{name}.grad", Average, 1.0, 1.0, process_set)
            if runtime.rank() == root_rank:  # job ranks both
                return averaged
            # A Session runs only what its fetches need, and zeros of a known shape need
            # nothing: without this dependency the other ranks would never submit the
            # all-reduce the root waits for.
            with tf.control_dependencies([averaged]):
                return tf.zeros_like(averaged)

        return _host_broadcast(x, root_rank, name, process_set), grad

    return give(tensor)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """`root_rank`'s `tensor` on every rank of `process_set` (the others' give only shape
    and dtype); `root_rank` is a job rank, which must belong to the set."""
    name = collective_name("broadcast", name, process_set)
    try:
        tensor = as_tensor(tensor, what("broadcast", name))
    except TypeError as error:
        return _fail_everywhere(error, [("broadcast", name)], process_set)
    return _broadcast(tensor, root_rank, name, process_set)


# -- alltoall and reducescatter ------------------------------------------------------------
def _host_alltoall(tensor, splits, name, process_set):
    def exchange(array, *given):
        received, counts = collectives.alltoall(array, given[0] if given else None, name, process_set)
        return [received, np.asarray(counts, dtype=np.int32)]

    inputs = [tensor] + ([splits] if splits is not None else [])
    return run_on_host(exchange, inputs, [tensor.dtype, tf.int32],
                       [_rows_shape(tensor.shape), tf.TensorShape([_set_size(process_set)])])


def _alltoall(tensor, splits, name, process_set):
    @tf.custom_gradient
    def exchange(x):
        received, received_splits = _host_alltoall(x, splits, name, process_set)

        def grad(upstream, _):
            return _alltoall(upstream, received_splits, f"{name}.grad", process_set)[0]

        return (received, received_splits), grad

    return exchange(tensor)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows `splits[r]` of `tensor` go to the r-th rank of `process_set` (an even split when
    None).

    Returns the rows received from every rank, in rank order; as in Horovod, with `splits`
    given, (those rows, int32 rows received from each rank)."""
    name = collective_name("alltoall", name, process_set)
    try:
        tensor = as_tensor(tensor, what("alltoall", name))
        if splits is not None:
            splits = as_tensor(splits, f"{what('alltoall', name)} splits")
    except TypeError as error:
        received = _fail_everywhere(error, [("alltoall", name)], process_set)
        received_splits = tf.zeros([_set_size(process_set)], tf.int32)
    else:
        received, received_splits = _alltoall(tensor, splits, name, process_set)
    return received if splits is None else (received, received_splits)


def _host_reducescatter(tensor, name, op, prescale, postscale, process_set):
    def scatter(array):
        return [collectives.reducescatter(array, op, prescale, postscale, name, process_set)]

    return run_on_host(scatter, [tensor], [tensor.dtype], [_rows_shape(tensor.shape)])[0]


def _reducescatter(tensor, name, op, prescale, postscale, process_set):
    @tf.custom_gradient
    def scatter(x):
        def grad(upstream):
            _check_differentiable("reducescatter", op)
            gathered = _allgather(upstream, f"{name}.grad", process_set)
            factor = reducescatter_gradient_factor(op, prescale, postscale, _set_size(process_set))
            return gathered if factor == 1.0 else gathered * tf.cast(factor, gathered.dtype)

        return _host_reducescatter(x, name, op, prescale, postscale, process_set), grad

    return scatter(tensor)


def reducescatter(tensor, compression=Compression.none, op=Average, name=None, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=global_process_set):
    """`tensor` reduced over the ranks of `process_set`, of which the r-th keeps block r of
    the rows (the first `rows % size` ranks one row more)."""
    name = collective_name("reducescatter", name, process_set)
    try:
        op = as_reduce_op(op)
        tensor = as_tensor(tensor, what("reducescatter", name))
    except (TypeError, ValueError) as error:
        return _fail_everywhere(error, [("reducescatter", name)], process_set)
    wire, ctx = compression.compress(tensor)
    return compression.decompress(_reducescatter(wire, name, op, prescale_factor, postscale_factor, process_set),
                                  ctx)


def grouped_reducescatter(tensors, compression=Compression.none, op=Average, name=None, prescale_factor=1.0,
                          postscale_factor=1.0, process_set=global_process_set):
    """Reducescatter each of `tensors` (named `name.0`, `name.1`...); returns a list."""
    base = collective_name("grouped_reducescatter", name, process_set)
    return [reducescatter(tensor, compression, op, f"{base}.{index}", prescale_factor, postscale_factor, process_set)
            for index, tensor in enumerate(tensors)]


# -- reduce -------------------------------------------------------------------------------------
def reduce(tensor, root_rank=0, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
           process_set=global_process_set):
    """`tensor` reduced over the ranks of `process_set` on `root_rank` (a job rank in the set);
    every other rank gets its own `tensor` back. Not differentiable."""
    name = collective_name("reduce", name, process_set)
    try:
        op = as_reduce_op(op)
        tensor = as_tensor(tensor, what("reduce", name))
    except (TypeError, ValueError) as error:
        return _fail_everywhere(error, [("reduce", name)], process_set)

    def reduce_to_root(array):
        return [collectives.reduce(array, root_rank, op, prescale_factor, postscale_factor, name, process_set)]

    return run_on_host(reduce_to_root, [tensor], [tensor.dtype], [tensor.shape])[0]


# -- join and barrier ------------------------------------------------------------------------
def join(process_set=global_process_set):
    """This rank is out of data (see hvdplus.join); returns the last rank (a job rank) of
    `process_set` to join, as an int32 scalar tensor."""
    require_member(process_set, "join()")  # a rank outside the set: raised now, not when a graph runs
    return run_on_host(lambda: [np.int32(collectives.join(process_set))], [], [tf.int32], [tf.TensorShape([])])[0]


def barrier(process_set=global_process_set):
    """Wait until every rank of `process_set` has reached this barrier (in a graph: when
    its op runs)."""
    name = collective_name("barrier", None, process_set)

    def wait():
        collectives.barrier(name, process_set)
        return []

    run_on_host(wait, [], [], [])
