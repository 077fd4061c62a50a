"""Adasum: an all-reduce that combines the ranks' arrays as Horovod's Adasum does
(hvdplus.comm.adasum), on floating dtypes over a power-of-two number of ranks.

Ranks agree on dtype, shape and scale factors. The engine gathers every rank's prescaled
vector and each rank combines them in the same tree, so all hold the same result. It does
not run beside a rank that has joined: a joined rank has no vector to combine.
"""

import numpy as np

from ...comm.adasum import adasum_tree, check_power_of_two
from ...comm.reduction import apply_scale
from ...common.dtypes import dtype_name
from ...common.reduce_ops import ReduceOp
from .. import arguments
from ..protocol import Agreement, Collective, Request
from .spec import KindSpec, declare

__all__ = ["ADASUM"]

ADASUM = Collective.declare("adasum")


def plan(name, runtime, array, prescale_factor, postscale_factor, output=None):
    what = f"allreduce '{name}'"
    check_power_of_two(runtime.topology.size, what)  # NotImplementedError: the same on every rank
    data = arguments.checked_array(array, what)
    if data.dtype.kind != "f" and dtype_name(data.dtype) != "bfloat16":
        raise TypeError(f"{what}: Adasum needs a floating dtype, got {dtype_name(data.dtype)}")
    if output is not None:
        arguments.check_output(output, data, what)
    _, prescale, postscale = arguments.reduction_arguments(data, ReduceOp.SUM, prescale_factor, postscale_factor,
                                                           what)
    agree = Agreement(dtype=dtype_name(data.dtype), shape=data.shape, reduce_op=ReduceOp.ADASUM,
                      prescale=prescale, postscale=postscale)
    return Request(ADASUM, name, agree), (data, output)


def run(comm, algorithms, batch, payload):
    agree = batch.requests[0].agree
    data, output = payload
    row = data.reshape(1, -1)
    if agree.prescale != 1.0:
        row = apply_scale(row, agree.prescale, out=np.empty_like(row))
    result = adasum_tree(algorithms.allgather(row, [1] * algorithms.size))
    if agree.postscale != 1.0:
        apply_scale(result, agree.postscale)
    result = result.reshape(data.shape)
    if output is None:
        return result
    output[...] = result
    return output


SPEC = declare(KindSpec(ADASUM, plan=plan, run=run, not_with_join="Adasum is not supported with Join."))
