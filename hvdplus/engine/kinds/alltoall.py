"""Alltoall: rank r sends rows `splits[s]` of its array to rank s and receives, in rank
order, what every rank sent it; the result is (received rows, rows from each rank).

Ranks agree on dtype and the dimensions after the first; each rank's splits travel beside the
agreement. It does not run beside a rank that has joined, as in Horovod.
"""

import numpy as np

from ...comm import mpi_collectives
from ...common.dtypes import dtype_name
from .. import arguments
from ..protocol import Agreement, Collective, Request
from .spec import KindSpec, declare

__all__ = ["ALLTOALL"]

ALLTOALL = Collective.ALLTOALL


def plan(name, runtime, array, splits):
    what = f"alltoall '{name}'"
    data = arguments.checked_array(array, what)
    arguments.check_has_rows(data, what)
    send = arguments.alltoall_splits(data, splits, runtime.topology.size, what)
    agree = Agreement(dtype=dtype_name(data.dtype), trailing_shape=data.shape[1:])
    return Request(ALLTOALL, name, agree, splits=tuple(send)), data


def run(comm, algorithms, batch, payload):
    me = comm.Get_rank()
    received = [splits[me] for splits in batch.per_rank]
    output = mpi_collectives.alltoall(comm, payload, batch.per_rank[me], received)
    return output, np.asarray(received, dtype=np.int64)


SPEC = declare(KindSpec(ALLTOALL, plan=plan, run=run, per_rank=lambda request: list(request.splits),
                        not_with_join="Alltoall is not supported with Join at this time."))
