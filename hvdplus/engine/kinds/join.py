"""Join: this rank has no more data. The engine sends it to the coordinator as a token
rather than a request; the batch that ends it (Outcome.JOIN_DONE) names the last rank to
join. Until then the rank takes part in the joinable kinds with what their specs contribute
for it, and the other kinds fail on every rank that calls them."""

from ..protocol import Collective, Request
from .spec import KindSpec, declare

__all__ = ["JOIN"]

JOIN = Collective.JOIN


def plan(name, runtime):
    return Request(JOIN, "__join__"), None


SPEC = declare(KindSpec(JOIN, plan=plan, run=None))
