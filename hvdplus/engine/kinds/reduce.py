"""Reduce: the elementwise reduction of every rank's array, delivered to one root rank
(MPI's Reduce); every other rank gets its own array back unchanged. Cheaper than an
all-reduce when one rank consumes the result: metrics, a checkpoint's averaged weights.

Ranks agree on the root, dtype, shape, reduce op and scale factors. A rank that has joined
contributes zeros.
"""

import numpy as np

from ...comm.mpi_collectives import MPI_OPS, finish_reduction, prepare_reduction
from ..protocol import Collective
from .reductions import reduction_plan, set_root
from .spec import JOINED, KindSpec, declare, zeros_to_reduce

__all__ = ["REDUCE"]

REDUCE = Collective.declare("reduce")


def plan(name, runtime, array, root_rank, op, prescale_factor, postscale_factor):
    root = set_root(root_rank, runtime, f"reduce '{name}'")
    return reduction_plan(REDUCE, name, array, op, prescale_factor, postscale_factor, root_rank=root)


def run(comm, algorithms, batch, payload):
    request = batch.requests[0]
    agree = request.agree
    data = zeros_to_reduce(request) if payload is JOINED else payload
    work = prepare_reduction(data, agree.prescale)
    if comm.Get_rank() != agree.root_rank:
        comm.Reduce(work, None, op=MPI_OPS[agree.reduce_op], root=agree.root_rank)
        return data
    result = np.empty_like(work)
    comm.Reduce(work, result, op=MPI_OPS[agree.reduce_op], root=agree.root_rank)
    finish_reduction(result, agree.reduce_op, agree.postscale, comm.Get_size())
    return result.astype(data.dtype, copy=False)


SPEC = declare(KindSpec(REDUCE, plan=plan, run=run, joinable=True))
