"""Reducescatter: the elementwise reduction of every rank's array, of which rank r keeps
block r of the rows (the first `rows % size` ranks one row more).

Ranks agree on dtype, shape, reduce op and scale factors. A rank that has joined contributes
zeros and gets nothing.
"""

from ..protocol import Collective
from .reductions import reduction_plan
from .spec import JOINED, KindSpec, declare, zeros_to_reduce

__all__ = ["REDUCESCATTER"]

REDUCESCATTER = Collective.REDUCESCATTER


def plan(name, runtime, array, op, prescale_factor, postscale_factor):
    return reduction_plan(REDUCESCATTER, name, array, op, prescale_factor, postscale_factor, needs_rows=True)


def run(comm, algorithms, batch, payload):
    request = batch.requests[0]
    agree = request.agree
    data = zeros_to_reduce(request) if payload is JOINED else payload
    return algorithms.reducescatter(data, agree.reduce_op, agree.prescale, agree.postscale)


SPEC = declare(KindSpec(REDUCESCATTER, plan=plan, run=run, joinable=True))
