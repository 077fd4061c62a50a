"""What a collective kind is: the one spec that the API, negotiation and the executor read.

A spec says how a call becomes a request (`plan`), whether the kind runs beside a rank that
has joined and what that rank then contributes (`joinable`, in `run`), what each rank adds to
the batch beyond the agreed values (`per_rank`), and how the batch runs on the comm layer
(`run`). The fields ranks agree on are the `Agreement` fields the plan fills in.
"""

import dataclasses
from typing import Any, Callable, Dict, Optional

import numpy as np

from ...common.dtypes import accumulation_dtype
from ..protocol import Collective, Request

__all__ = ["KindSpec", "JOINED", "declare", "spec_of", "zeros_to_reduce"]

# The payload of a name on a rank that has joined: it has no tensor, only takes part.
JOINED = object()


@dataclasses.dataclass(frozen=True)
class KindSpec:
    """Everything about one collective kind.

    Args:
        kind: the kind's name (see protocol.Collective).
        plan: `plan(name, runtime, *call_args) -> (Request, payload)`, run on the caller's
            thread; `runtime` is the process set's runtime (its `topology.size`, `is_job`,
            `set_rank_of`). TypeError and ValueError are the caller's argument errors, which
            every rank then raises. None for kinds whose requests the API makes by hand.
        run: `run(comm, algorithms, batch, payload) -> result`, on the engine thread, alike
            on every rank; `payload` is JOINED on a rank that has joined (joinable kinds only).
        joinable: whether ranks that have joined take part (see core.collectives.join).
        not_with_join: for a kind that is not joinable, Horovod's words for the error.
        per_rank: what each rank's request adds to the batch (allgather's rows, alltoall's
            splits), gathered by the coordinator in rank order; None when nothing.
        fused: whether batches of this kind fuse several names (all-reduce only).
    """

    kind: Collective
    plan: Optional[Callable[..., Any]]
    run: Optional[Callable[..., Any]]
    joinable: bool = False
    not_with_join: str = ""
    per_rank: Optional[Callable[[Request], Any]] = None
    fused: bool = False


_SPECS: Dict[Collective, KindSpec] = {}


def declare(spec: KindSpec) -> KindSpec:
    """Register `spec` as its kind's one spec."""
    if spec.kind in _SPECS:
        raise ValueError(f"collective kind {spec.kind!r} has a spec already")
    _SPECS[spec.kind] = spec
    return spec


def spec_of(kind: Collective) -> KindSpec:
    """The spec of `kind`."""
    return _SPECS[kind]


def zeros_to_reduce(request: Request) -> np.ndarray:
    """A joined rank's contribution to a reduction: zeros of the agreed shape, in the type
    the reduction accumulates in."""
    return np.zeros(request.agree.shape, dtype=accumulation_dtype(request.agree.dtype))
