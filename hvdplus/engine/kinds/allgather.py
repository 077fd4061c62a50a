"""Allgather: every rank's array, concatenated along the first dimension in rank order.

Ranks agree on dtype and the dimensions after the first; each rank's rows may differ and
travel beside the agreement. It does not run beside a rank that has joined, as in Horovod.
"""

from ...common.dtypes import dtype_name
from .. import arguments
from ..protocol import Agreement, Collective, Request
from .spec import KindSpec, declare

__all__ = ["ALLGATHER"]

ALLGATHER = Collective.ALLGATHER


def plan(name, runtime, array):
    what = f"allgather '{name}'"
    data = arguments.checked_array(array, what)
    arguments.check_has_rows(data, what)
    agree = Agreement(dtype=dtype_name(data.dtype), trailing_shape=data.shape[1:])
    return Request(ALLGATHER, name, agree, rows=data.shape[0]), data


def run(comm, algorithms, batch, payload):
    return algorithms.allgather(payload, batch.per_rank)


SPEC = declare(KindSpec(
    ALLGATHER, plan=plan, run=run, per_rank=lambda request: request.rows,
    not_with_join="Allgather is not supported with Join at this time. "
                  "Specify sparse_to_dense=True if using DistributedOptimizer"))
