"""Broadcast: every rank gets the root's array; the others' arrays give shape and dtype.

Ranks agree on the root, dtype and shape. It does not run beside a rank that has joined, as
in Horovod.
"""

from ...comm import mpi_collectives
from ...common.dtypes import dtype_name
from .. import arguments
from ..protocol import Agreement, Collective, Request
from .reductions import set_root
from .spec import KindSpec, declare

__all__ = ["BROADCAST"]

BROADCAST = Collective.BROADCAST


def plan(name, runtime, array, root_rank):
    what = f"broadcast '{name}'"
    data = arguments.checked_array(array, what)
    root = set_root(root_rank, runtime, what)
    return Request(BROADCAST, name, Agreement(root_rank=root, dtype=dtype_name(data.dtype), shape=data.shape)), data


def run(comm, algorithms, batch, payload):
    return mpi_collectives.broadcast(comm, payload, batch.requests[0].agree.root_rank)


SPEC = declare(KindSpec(BROADCAST, plan=plan, run=run,
                        not_with_join="Broadcast is not supported with Join at this time."))
