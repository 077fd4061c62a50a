"""All-reduce: every rank gets the elementwise reduction of every rank's array.

The one kind whose batches fuse several names into one collective (see fusion.py). Ranks
agree on dtype, shape, reduce op and scale factors (and, for a group, each member's dtype and
shape and the group's layout). A rank that has joined contributes zeros.

Where a batch is reduced is decided here, once, from agreed values: `reduced_where_it_lies`
is the rule for both a group's layout (packing.py, at the call) and a batch's path (here,
on the engine thread), so the two never disagree.
"""

import math

import numpy as np

from ...common.dtypes import accumulation_dtype, dtype_name
from ...common.reduce_ops import ReduceOp
from ...common.scaling import scale_factor
from ...comm.output_pool import aligned_layout
from ..protocol import Collective, GroupLayout
from ..timeline import now_us
from .reductions import reduction_plan
from .spec import JOINED, KindSpec, declare, zeros_to_reduce

__all__ = ["ALLREDUCE", "Members", "reduced_where_it_lies"]

ALLREDUCE = Collective.ALLREDUCE
# Looked up per batch: module names are cheaper than enum-like members looked up on a class.
_MEMBERS = GroupLayout.MEMBERS


class Members:
    """A group's payload when it is reduced member by member: each member's flat array, and
    the flat array its result goes to."""

    __slots__ = ("arrays", "outputs")

    def __init__(self, arrays, outputs):
        self.arrays = arrays
        self.outputs = outputs  # the members themselves where reduced in place


def reduced_where_it_lies(dtypes, reduce_as: str, prescale: float, in_shared_memory: bool) -> bool:
    """Whether arrays of `dtypes`, reduced as `reduce_as` with `prescale`, are reduced from
    where they lie (or into their outputs) rather than through a packed buffer: on one node
    (the engine reduces in shared memory), when nothing is prescaled and no array needs a
    conversion."""
    return in_shared_memory and prescale == 1.0 and all(name == reduce_as for name in dtypes)


def plan(name, runtime, array, op, prescale_factor, postscale_factor, output=None):
    request, data = reduction_plan(ALLREDUCE, name, array, op, prescale_factor, postscale_factor, output)
    return request, (data, output)


def run_fused(algorithms, batch, payloads, fusion_buffer, timeline=None):
    """All-reduce every tensor of `batch` with one collective over a packed buffer.

    A payload is (array, output or None), Members, or JOINED on a rank that has joined."""
    agree = batch.requests[0].agree
    # Fused batches share the mark (see fusion_key): their Average is then a plain sum.
    op = ReduceOp.SUM if agree.averaged_while_packing else agree.reduce_op
    scaling = (op, agree.prescale, agree.postscale)
    in_shared_memory = algorithms.engine_algorithm == "shm"
    # The dtype's name is looked up only where the engine reduces in shared memory at all.
    if agree.layout is _MEMBERS or in_shared_memory and reduced_where_it_lies(
            (agree.dtype,), dtype_name(accumulation_dtype(agree.dtype)), agree.prescale, in_shared_memory):
        return _allreduce_in_shared_memory(algorithms, batch, payloads, scaling, timeline)
    if len(payloads) == 1 and payloads[0] is not JOINED:
        # Nothing to fuse: reduce straight from the caller's array, saving two copies.
        start = now_us()
        data, output = payloads[0]
        result = algorithms.allreduce(data, *scaling, algorithm=algorithms.engine_algorithm, output=output)
        if timeline is not None:
            timeline.span(batch.names[0], "ALLREDUCE", start, now_us(), bytes=int(result.nbytes))
        return [result]
    return _allreduce_packed(algorithms, batch, payloads, fusion_buffer, scaling, timeline)


def _allreduce_packed(algorithms, batch, payloads, fusion_buffer, scaling, timeline):
    agree = batch.requests[0].agree
    counts = [math.prod(r.agree.shape) for r in batch.requests]
    flat = fusion_buffer.view(accumulation_dtype(agree.dtype), sum(counts))
    start = now_us()
    offset = 0
    for payload, count in zip(payloads, counts):
        flat[offset:offset + count] = 0 if payload is JOINED else payload[0].reshape(-1)
        offset += count
    packed = now_us()
    algorithms.allreduce_in_place(flat, *scaling, algorithm=algorithms.engine_algorithm)
    reduced = now_us()
    fresh = _fresh_outputs(algorithms, payloads)
    results, offset = [], 0
    for payload, count, request in zip(payloads, counts, batch.requests):
        piece = flat[offset:offset + count].reshape(request.agree.shape)
        offset += count
        if payload is JOINED:
            results.append(None)
            continue
        output = next(fresh) if payload[1] is None else payload[1]
        np.copyto(output, piece, casting="unsafe")
        results.append(output)
    if timeline is not None:
        done = now_us()
        for name in batch.names:
            timeline.span(name, "MEMCPY_IN_FUSION_BUFFER", start, packed, tensors=len(batch.names))
            timeline.span(name, "ALLREDUCE", packed, reduced, bytes=int(flat.nbytes))
            timeline.span(name, "MEMCPY_OUT_FUSION_BUFFER", reduced, done)
    return results


def _allreduce_in_shared_memory(algorithms, batch, payloads, scaling, timeline):
    """Fused all-reduce through the node's shared window, straight from and into the
    tensors' own memory (an output that is the input itself is reduced in place). A group
    reduced member by member (Members) contributes each member."""
    op, _, postscale = scaling
    start = now_us()
    sources, targets, results = [], [], []
    fresh = _fresh_outputs(algorithms, payloads)
    for payload, request in zip(payloads, batch.requests):
        if payload is JOINED:
            for zeros in _joined_zeros(request):
                sources.append(zeros)
                targets.append(zeros)
            results.append(None)
        elif isinstance(payload, Members):
            sources.extend(payload.arrays)
            targets.extend(payload.outputs)
            results.append(payload.outputs)
        else:
            data, output = payload
            if output is None:
                output = next(fresh)
            sources.append(data.reshape(-1))
            targets.append(output.reshape(-1))
            results.append(output)
    scale = scale_factor(op, 1.0, postscale, algorithms.size)
    algorithms.allreduce_arrays(sources, op, scale, targets)
    if timeline is not None:
        done = now_us()
        for name in batch.names:
            timeline.span(name, "ALLREDUCE", start, done, tensors=len(batch.names), where="in place, shared memory")
    return results


def _fresh_outputs(algorithms, payloads):
    """Outputs for the payloads that bring none, in order: aligned views of one block from
    the output pool, which recycles it once the caller drops them all. One block a batch, as a
    pooled buffer whose pages are mapped already: a new array per tensor comes from the
    allocator, which returns each step's memory to the system and faults it in again."""
    wanting = [p[0] for p in payloads if p is not JOINED and not isinstance(p, Members) and p[1] is None]
    if not wanting:
        return iter(())
    if len({data.dtype for data in wanting}) > 1:
        return (algorithms.outputs.empty(data.shape, data.dtype) for data in wanting)
    starts, total = aligned_layout([data.size for data in wanting], wanting[0].dtype.itemsize)
    block = algorithms.outputs.empty((total,), wanting[0].dtype)
    return iter(block[start:start + data.size].reshape(data.shape) for start, data in zip(starts, wanting))


def _joined_zeros(request):
    """A joined rank's stand-ins for a request: one flat array, or one per member of a group
    that the other ranks reduce member by member."""
    agree = request.agree
    if agree.layout is not _MEMBERS:
        return [zeros_to_reduce(request).reshape(-1)]
    dtype = accumulation_dtype(agree.dtype)
    return [np.zeros(math.prod(shape), dtype=dtype) for shape in agree.member_shapes]


SPEC = declare(KindSpec(ALLREDUCE, plan=plan, run=run_fused, joinable=True, fused=True))
