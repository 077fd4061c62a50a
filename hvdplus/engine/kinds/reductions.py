"""The plan that the reductions share (all-reduce, reducescatter, reduce): the checked
array, its reduce op and scale factors, as one request."""

import functools

from ...common.dtypes import dtype_name
from .. import arguments
from ..protocol import Agreement, Collective, Request

__all__ = ["reduction_plan", "set_root"]


@functools.lru_cache(maxsize=4096)
def _reduction_agreement(dtype: str, shape: tuple, op, prescale: float, postscale: float,
                         root_rank=None) -> Agreement:
    """The Agreement of a reduction, made once per distinct tensor description: a training
    step describes the same tensors every step, and building a frozen dataclass of a dozen
    fields would otherwise be a sizeable part of submitting a small all-reduce."""
    return Agreement(root_rank=root_rank, dtype=dtype, shape=shape, reduce_op=op, prescale=prescale,
                     postscale=postscale)


def reduction_plan(kind: Collective, name: str, array, op, prescale_factor, postscale_factor, output=None,
                   needs_rows=False, root_rank=None):
    """(request, checked array) of a reduction of `array`; `output` (checked here) is where
    the caller wants the result, `needs_rows` whether the kind splits the first dimension,
    `root_rank` the agreed root for a kind that has one."""
    what = f"{kind} '{name}'"
    data = arguments.checked_array(array, what)
    if output is not None:
        arguments.check_output(output, data, what)
    if needs_rows:
        arguments.check_has_rows(data, what)
    op_, pre, post = arguments.reduction_arguments(data, op, prescale_factor, postscale_factor, what)
    return Request(kind, name, _reduction_agreement(dtype_name(data.dtype), data.shape, op_, pre, post,
                                                    root_rank)), data


def set_root(root_rank, runtime, what: str) -> int:
    """The root's rank within `runtime` (a process set's, or the job's): `root_rank` is a
    job rank, as in Horovod, and must belong to the set."""
    if runtime.is_job:
        return arguments.check_root_rank(root_rank, runtime.topology.size, what)
    # Any job rank may be named; set_rank_of says when it is not one of the set's.
    return runtime.set_rank_of(arguments.check_root_rank(root_rank, float("inf"), what), what)
