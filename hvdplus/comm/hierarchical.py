"""Hierarchical all-reduce: reduce inside each node first, so only one share of the data crosses nodes.

Traffic inside a node is cheap (shared memory); traffic between nodes is not. When every
node has the same number of ranks, local rank i of every node owns shard i of the buffer:
a reduce-scatter inside the node gives each local rank its shard summed over the node, an
all-reduce over the cross communicator (local rank i of every node) completes the shard,
and an all-gather inside the node hands every shard to every local rank. Each rank then
sends only 1/local_size of the buffer across nodes.

When nodes hold different numbers of ranks, shards would not line up across nodes. Then
each node reduces onto its leader (local rank 0), the leaders all-reduce the whole buffer
among themselves, and each leader broadcasts the result inside its node.

Buffers follow the convention of every all-reduce algorithm of hvdplus: flat, C-contiguous,
1-d, in their accumulation dtype, with Average reduced as a sum that the caller divides.
"""

from typing import Callable

import numpy as np
from mpi4py import MPI

from ..common.reduce_ops import ReduceOp
from .mpi_collectives import MPI_OPS, reducescatter_rows

__all__ = ["hierarchical_allreduce", "PIECE_BYTES"]

# The buffer goes through the node's and the cross-node steps in pieces of this size.
PIECE_BYTES = 4 << 20

CrossAllreduce = Callable[["MPI.Intracomm", np.ndarray, ReduceOp], None]


def hierarchical_allreduce(topology, flat: np.ndarray, op: ReduceOp, cross_allreduce: CrossAllreduce,
                           piece_bytes: int = PIECE_BYTES) -> None:
    """Reduce `flat` elementwise over every rank of the job, in place, node by node.

    Every rank of the job calls this with the same `flat.size`, `op` and `cross_allreduce`.

    Args:
        topology: has `local_comm` (this node's ranks), `cross_comm` (the ranks sharing this
            rank's local rank, one per node) and `homogeneous` (every node has as many ranks).
        flat: contiguous 1-d buffer in its accumulation dtype; holds the result afterwards.
        op: the reduction; Average is summed (the caller divides).
        cross_allreduce: `f(comm, flat, op)` that all-reduces in place across nodes, such as
            `ring_allreduce`. It is given Sum for Average, so it never divides.
        piece_bytes: on homogeneous nodes, the size of the pieces that go through the steps
            in turn.
    """
    if flat.size == 0:
        return
    if op == ReduceOp.AVERAGE:
        op = ReduceOp.SUM
    if topology.homogeneous:
        _allreduce_by_shards(topology, flat, op, cross_allreduce, piece_bytes)
    else:
        _allreduce_through_leaders(topology, flat, op, cross_allreduce)


def _allreduce_by_shards(topology, flat, op, cross_allreduce, piece_bytes):
    """Reduce-scatter in the node, all-reduce each shard across nodes, all-gather in the node,
    piece by piece: while one piece crosses the nodes, the node reduces the next and gathers
    the one before (the nonblocking collectives progress inside the cross all-reduce's MPI
    calls), so the network is not idle while the node's memory works."""
    local = topology.local_comm
    local_size, local_rank = local.Get_size(), local.Get_rank()
    if local_size == 1:
        cross_allreduce(topology.cross_comm, flat, op)
        return
    step = max(local_size, piece_bytes // flat.itemsize)
    pieces = [flat[start:start + step] for start in range(0, flat.size, step)]

    def reduce_in_node(piece):
        counts = reducescatter_rows(piece.size, local_size)
        # In place, MPI leaves this rank's reduced shard at the front of the piece.
        return local.Ireduce_scatter(MPI.IN_PLACE, piece, recvcounts=counts, op=MPI_OPS[op]), counts

    gathers = []
    reducing = reduce_in_node(pieces[0])
    for index, piece in enumerate(pieces):
        request, counts = reducing
        request.Wait()
        if index + 1 < len(pieces):
            reducing = reduce_in_node(pieces[index + 1])
        start = sum(counts[:local_rank])
        shard = piece[start:start + counts[local_rank]]
        if start:
            shard[...] = piece[:shard.size]
        cross_allreduce(topology.cross_comm, shard, op)
        displacements = [sum(counts[:r]) for r in range(local_size)]
        gathers.append(local.Iallgatherv(MPI.IN_PLACE, [piece, (counts, displacements)]))
    MPI.Request.Waitall(gathers)


def _allreduce_through_leaders(topology, flat, op, cross_allreduce):
    """Reduce onto local rank 0, all-reduce among the nodes' local ranks 0, broadcast in the node."""
    local = topology.local_comm
    leader = local.Get_rank() == 0
    if local.Get_size() > 1:
        if leader:
            local.Reduce(MPI.IN_PLACE, flat, op=MPI_OPS[op], root=0)
        else:
            local.Reduce(flat, None, op=MPI_OPS[op], root=0)
    if leader:
        cross_allreduce(topology.cross_comm, flat, op)
    if local.Get_size() > 1:
        local.Bcast(flat, root=0)
