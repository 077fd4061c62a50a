"""Executing the batches the engine agreed on: the data plane of the engine.

Every rank runs the same batches in the same order. A rank that has joined has no entry
for a name and takes part in reductions with zeros, so the other ranks' collectives still
complete; allgather, alltoall and broadcast never run beside a joined rank (see
protocol.JOINABLE).
"""

import math

import numpy as np

from ..comm import mpi_collectives
from ..common.dtypes import accumulation_dtype, dtype_name
from ..common.reduce_ops import ReduceOp
from .packing import Members
from .protocol import Collective, GroupLayout
from .timeline import now_us

__all__ = ["JOINED", "execute_batch"]

# The payload of a name on a rank that has joined: it has no tensor, only takes part.
JOINED = object()
# Looked up per batch: module names are cheaper than enum members looked up on their class.
_ALLREDUCE, _MEMBERS = Collective.ALLREDUCE, GroupLayout.MEMBERS


def _zeros_to_reduce(request) -> np.ndarray:
    return np.zeros(request.agree.shape, dtype=accumulation_dtype(request.agree.dtype))


def fused_allreduce(algorithms, batch, payloads, fusion_buffer, timeline=None):
    """All-reduce every tensor of `batch` with one collective over a packed buffer.

    A payload is (array, output or None), or JOINED on a rank that has joined."""
    agree = batch.requests[0].agree
    # Fused batches share the mark (see fusion_key): their Average is then a plain sum.
    op = ReduceOp.SUM if agree.averaged_while_packing else agree.reduce_op
    scaling = (op, agree.prescale, agree.postscale)
    # The path depends on agreed values only: every rank must run the same algorithm.
    if _reducible_in_place(algorithms, agree):
        return _allreduce_in_shared_memory(algorithms, batch, payloads, scaling, timeline)
    if len(payloads) == 1 and payloads[0] is not JOINED:
        # Nothing to fuse: reduce straight from the caller's array, saving two copies.
        start = now_us()
        data, output = payloads[0]
        result = algorithms.allreduce(data, *scaling, algorithm=algorithms.engine_algorithm, output=output)
        if timeline is not None:
            timeline.span(batch.names[0], "ALLREDUCE", start, now_us(), bytes=int(result.nbytes))
        return [result]
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
    results, offset = [], 0
    for payload, count, request in zip(payloads, counts, batch.requests):
        piece = flat[offset:offset + count].reshape(request.agree.shape)
        offset += count
        if payload is JOINED:
            results.append(None)
        elif payload[1] is None:
            results.append(piece.astype(payload[0].dtype))
        else:
            np.copyto(payload[1], piece, casting="unsafe")
            results.append(payload[1])
    if timeline is not None:
        done = now_us()
        for name in batch.names:
            timeline.span(name, "MEMCPY_IN_FUSION_BUFFER", start, packed, tensors=len(batch.names))
            timeline.span(name, "ALLREDUCE", packed, reduced, bytes=int(flat.nbytes))
            timeline.span(name, "MEMCPY_OUT_FUSION_BUFFER", reduced, done)
    return results


def _reducible_in_place(algorithms, agree) -> bool:
    """On one node, tensors already in their accumulation dtype and not prescaled are
    reduced where they lie (or in their output) instead of through the fusion buffer; a
    group laid out member by member is one of them (groups.group_layout)."""
    if agree.layout is _MEMBERS:
        return True
    return (algorithms.engine_algorithm == "shm" and agree.prescale == 1.0
            and dtype_name(accumulation_dtype(agree.dtype)) == agree.dtype)


def _allreduce_in_shared_memory(algorithms, batch, payloads, scaling, timeline):
    """Fused all-reduce through the node's shared window, straight from and into the
    tensors' own memory (an output that is the input itself is reduced in place). A group
    reduced member by member (groups.Members) contributes each member."""
    op, _, postscale = scaling
    start = now_us()
    sources, targets, results = [], [], []
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
                output = algorithms.outputs.empty(data.shape, data.dtype)
            sources.append(data.reshape(-1))
            targets.append(output.reshape(-1))
            results.append(output)
    scale = postscale / algorithms.size if op == ReduceOp.AVERAGE else postscale
    algorithms.allreduce_arrays(sources, op, scale, targets)
    if timeline is not None:
        done = now_us()
        for name in batch.names:
            timeline.span(name, "ALLREDUCE", start, done, tensors=len(batch.names), where="in place, shared memory")
    return results


def _joined_zeros(request):
    """A joined rank's stand-ins for a request: one flat array, or one per member of a group
    that the other ranks reduce member by member."""
    agree = request.agree
    if agree.layout is not _MEMBERS:
        return [_zeros_to_reduce(request).reshape(-1)]
    dtype = accumulation_dtype(agree.dtype)
    return [np.zeros(math.prod(shape), dtype=dtype) for shape in agree.member_shapes]


def _single(comm, algorithms, batch, payload):
    request = batch.requests[0]
    agree = request.agree
    kind = batch.kind
    if kind is Collective.ALLGATHER:
        return algorithms.allgather(payload, batch.per_rank)
    if kind is Collective.BROADCAST:
        return mpi_collectives.broadcast(comm, payload, agree.root_rank)
    if kind is Collective.REDUCESCATTER:
        data = payload if payload is not JOINED else _zeros_to_reduce(request)
        return algorithms.reducescatter(data, agree.reduce_op, agree.prescale, agree.postscale)
    if kind is Collective.ALLTOALL:
        me = comm.Get_rank()
        received = [splits[me] for splits in batch.per_rank]
        output = mpi_collectives.alltoall(comm, payload, batch.per_rank[me], received)
        return output, np.asarray(received, dtype=np.int64)
    if kind is Collective.BARRIER:
        return None
    if kind is Collective.BROADCAST_OBJECT:
        return comm.bcast(payload, root=agree.root_rank)
    if kind is Collective.ALLGATHER_OBJECT:
        return comm.allgather(payload)
    raise ValueError(f"unknown collective kind {kind!r}")


def execute_batch(comm, algorithms, batch, payloads, fusion_buffer, timeline=None):
    """Run `batch` on `comm`; return one result per name (None where this rank has joined)."""
    if batch.kind is _ALLREDUCE:
        return fused_allreduce(algorithms, batch, payloads, fusion_buffer, timeline)
    start = now_us()
    result = _single(comm, algorithms, batch, payloads[0])
    if timeline is not None:
        timeline.span(batch.names[0], batch.kind.value.upper(), start, now_us())
    return [None if payloads[0] is JOINED else result]
