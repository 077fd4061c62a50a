"""A grouped all-reduce travels as one array: its members packed end to end.

A training step's gradients handed over as a group (TensorFlow's DistributedGradientTape,
Keras' optimizer, torch's grouped_allreduce) become one named request and one contiguous
buffer, so the engine negotiates, fuses and reduces one thing rather than one name per
member, and pays its per-name bookkeeping once a step instead of once a gradient. Every rank
must describe its group alike, member by member, so the request carries each member's
dtype and shape for the agreement check, and a group stays atomic by construction.

Packing costs a copy into the packed buffer (and out of it, in place). A group whose
members need no conversion is instead reduced member by member from where the members lie
(`Members`) when the engine reduces in shared memory (all ranks on one node), split into
MPI calls and shared-window passes by the agreed sizes alike on every rank: in place
(torch's grouped_allreduce_ and DistributedOptimizer) into the members themselves, else
into one new buffer laid out as a packed one, whose views are the results. Reading the
members where they lie saves the copy into the packed buffer and out of it, a pass over
every gradient each step; the other algorithms (MPI, ring, hierarchical) take one flat
buffer, so for them a group is packed.

An Average over a power-of-two number of ranks is applied while packing, where members need
no conversion: multiplying by 1/size on the way in costs what the copy costs, and saves a
pass over the reduced buffer after the sum. Scaling by a power of two is exact, so the sum
of the scaled members rounds to exactly the scaled sum: the results are bit for bit those of
dividing afterwards (barring subnormals), and a sum that would overflow no longer does.
Other sizes divide after the sum.

Each member starts on a 64-byte boundary of the packed buffer (zeros between them), so that
its result, a view, is aligned as TensorFlow needs to take it without a copy.

Members are packed in the type they are reduced in (float32 for half types). A group whose
members reduce in different types is reduced in float64, which is exact for every
supported type except int64 values beyond 2**53.
"""

import dataclasses

import numpy as np

from ..comm.memory import same_memory
from ..comm.output_pool import aligned_layout
from ..common.dtypes import accumulation_dtype, dtype_name
from ..common.reduce_ops import ReduceOp
from ..common.scaling import scale_factor
from . import arguments
from .kinds.allreduce import ALLREDUCE, Members, reduced_where_it_lies
from .protocol import Agreement, GroupLayout, Request

__all__ = ["grouped_request", "group_layout"]

_FLOAT64 = np.dtype(np.float64)


def group_layout(member_dtypes, reduce_as: str, prescale: float, in_shared_memory: bool) -> GroupLayout:
    """How a group is laid out, by the all-reduce's one rule (kinds.allreduce.reduced_where_it_lies).
    The layout is agreed with the rest, so the executor and a joined rank read it from the
    request rather than deciding again."""
    if reduced_where_it_lies(member_dtypes, reduce_as, prescale, in_shared_memory):
        return GroupLayout.MEMBERS
    return GroupLayout.PACKED


def grouped_request(group: str, arrays, outputs, op, prescale_factor, postscale_factor, pool,
                    in_shared_memory: bool = False, size: int = 1):
    """(request, payload, finish) for the engine: one all-reduce of the group.

    `outputs` holds one output array or None per member (the member itself: in place);
    `pool` gives the packed buffer, which the results (views of it) keep alive;
    `in_shared_memory` says that the engine reduces in shared memory (see group_layout);
    `size` is the number of ranks. `finish` turns the engine's result into the list of
    results. Raises TypeError/ValueError naming the member for bad arguments."""
    members, checked = [], {}
    for index, (array, output) in enumerate(zip(arrays, outputs)):
        data = array
        # The checks depend on the dtype alone, and an output that is the array itself only
        # needs to be writable in place: a step's dozens of gradients make this loop worth
        # keeping lean.
        if type(data) is not np.ndarray or data.dtype not in checked or (output is not None and output is not data):
            what = f"grouped_allreduce '{group}' member {index}"
            data = arguments.checked_array(array, what)
            if output is not None:
                arguments.check_output(output, data, what)
            if data.dtype not in checked:
                checked[data.dtype] = arguments.reduction_arguments(data, op, prescale_factor, postscale_factor, what)
        elif output is not None and not (output.flags.c_contiguous and output.flags.writeable):
            arguments.check_output(output, data, f"grouped_allreduce '{group}' member {index}")
        members.append(data)
    if not members:
        raise ValueError(f"grouped_allreduce '{group}' has no tensors")
    op, prescale, postscale = checked[members[0].dtype]
    kinds = {accumulation_dtype(dtype) for dtype in checked}
    reduce_as = kinds.pop() if len(kinds) == 1 else _FLOAT64
    names = {dtype: dtype_name(dtype) for dtype in checked}
    counts = [data.size for data in members]
    starts, packed_size = aligned_layout(counts, reduce_as.itemsize)
    member_dtypes = tuple(names[data.dtype] for data in members)
    agree = Agreement(member_dtypes=member_dtypes, member_shapes=tuple(data.shape for data in members),
                      in_place=all(out is data for out, data in zip(outputs, members)),
                      dtype=reduce_as.name, shape=(packed_size,), reduce_op=op,
                      prescale=prescale, postscale=postscale,
                      layout=group_layout(member_dtypes, reduce_as.name, prescale, in_shared_memory))
    if agree.layout is GroupLayout.MEMBERS:
        payload, finish = _member_wise(members, outputs, starts, packed_size, pool)
        return Request(ALLREDUCE, group, agree), payload, finish

    def finish(reduced):
        return _unpack(reduced, members, outputs, starts)

    if len(members) == 1 and members[0].dtype == reduce_as and members[0].flags.c_contiguous:
        # Nothing to pack: the engine reduces the member where it lies.
        output = outputs[0]
        payload = (members[0].reshape(-1), None if output is None else output.reshape(-1))
        return Request(ALLREDUCE, group, agree), payload, finish
    scale = 1.0
    if _average_while_packing(agree, size):
        agree = dataclasses.replace(agree, averaged_while_packing=True)
        scale = scale_factor(agree.reduce_op, 1.0, 1.0, size)
    packed = pool.empty((packed_size,), reduce_as)
    end = 0
    for data, start, count in zip(members, starts, counts):
        packed[end:start] = 0
        end = start + count
        if scale == 1.0:
            packed[start:end] = data.reshape(-1)
        else:
            np.multiply(data.reshape(-1), scale, out=packed[start:end])
    return Request(ALLREDUCE, group, agree), (packed, packed), finish


def _member_wise(members, outputs, starts, packed_size, pool):
    """(payload, finish) reducing each member from where it lies: into its output (a
    checked, C-contiguous one, possibly the member itself), else into its place in one new
    buffer laid out as a packed one (aligned views, as TensorFlow takes them uncopied)."""
    results = list(outputs)
    if any(output is None for output in outputs):
        fresh = pool.empty((packed_size,), members[0].dtype)
        for index, (data, start) in enumerate(zip(members, starts)):
            if results[index] is None:
                results[index] = fresh[start:start + data.size].reshape(data.shape)
    flat = [data.reshape(-1) for data in members]
    # In place (torch's gradients), a member's flat view serves as its output's too.
    flat_results = [view if result is data else result.reshape(-1)
                    for result, data, view in zip(results, members, flat)]
    return Members(flat, flat_results), lambda _: results


def _average_while_packing(agree, size: int) -> bool:
    """Whether a packed group's Average is applied while packing: over a power of two of
    ranks, for floating members packed without conversion. Agreed values only, so every
    rank decides alike; the engine then sums (kinds.allreduce.run_fused)."""
    return (agree.reduce_op == ReduceOp.AVERAGE and size > 1 and size & (size - 1) == 0
            and np.dtype(agree.dtype).kind == "f"
            and all(name == agree.dtype for name in agree.member_dtypes))


def _unpack(reduced: np.ndarray, members, outputs, starts):
    """Each member's result: written into its output, else a view of `reduced` (a copy in
    the member's dtype where that differs)."""
    results = []
    for data, output, start in zip(members, outputs, starts):
        piece = reduced[start:start + data.size].reshape(data.shape)
        if output is not None:
            if not same_memory(output, piece):  # a single member reduced in place already is
                np.copyto(output, piece, casting="unsafe")
            results.append(output)
        elif piece.dtype == data.dtype:
            results.append(piece)
        else:
            results.append(piece.astype(data.dtype))
    return results
