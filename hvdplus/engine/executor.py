"""Executing the batches the engine agreed on: the data plane of the engine.

Every rank runs the same batches in the same order, each by its kind's spec (see kinds/).
A rank that has joined has no entry for a name: its payload is JOINED, and only joinable
kinds run beside it (negotiation fails the others on every rank first).
"""

from .kinds import JOINED, spec_of
from .timeline import now_us

__all__ = ["JOINED", "execute_batch"]


def execute_batch(comm, algorithms, batch, payloads, fusion_buffer, timeline=None):
    """Run `batch` on `comm`; return one result per name (None where this rank has joined)."""
    spec = spec_of(batch.kind)
    if spec.fused:
        return spec.run(algorithms, batch, payloads, fusion_buffer, timeline)
    start = now_us()
    result = spec.run(comm, algorithms, batch, payloads[0])
    if timeline is not None:
        timeline.span(batch.names[0], batch.kind.upper(), start, now_us())
    return [None if payloads[0] is JOINED else result]
