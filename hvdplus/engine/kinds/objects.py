"""Barrier and the collectives on picklable objects: broadcast_object (every rank gets the
root's object) and allgather_object (every rank's object, in rank order).

Ranks agree on the root of broadcast_object. A barrier completes beside ranks that have
joined; the object collectives do not run beside them.
"""

from ..protocol import Agreement, Collective, Request
from .reductions import set_root
from .spec import KindSpec, declare

__all__ = ["BARRIER", "BROADCAST_OBJECT", "ALLGATHER_OBJECT"]

BARRIER = Collective.BARRIER
BROADCAST_OBJECT = Collective.BROADCAST_OBJECT
ALLGATHER_OBJECT = Collective.ALLGATHER_OBJECT


def _plan_barrier(name, runtime):
    return Request(BARRIER, name), None


def _plan_broadcast_object(name, runtime, obj, root_rank):
    root = set_root(root_rank, runtime, f"broadcast_object '{name}'")
    return Request(BROADCAST_OBJECT, name, Agreement(root_rank=root)), obj


def _plan_allgather_object(name, runtime, obj):
    return Request(ALLGATHER_OBJECT, name), obj


declare(KindSpec(BARRIER, plan=_plan_barrier, run=lambda comm, algorithms, batch, payload: None, joinable=True))
declare(KindSpec(BROADCAST_OBJECT, plan=_plan_broadcast_object,
                 run=lambda comm, algorithms, batch, obj: comm.bcast(obj, root=batch.requests[0].agree.root_rank)))
declare(KindSpec(ALLGATHER_OBJECT, plan=_plan_allgather_object,
                 run=lambda comm, algorithms, batch, obj: comm.allgather(obj)))
