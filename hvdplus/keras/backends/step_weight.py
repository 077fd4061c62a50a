"""A training step's gradient all-reduce weighted by this rank's sample count, read on the host
when the step runs.

Keras compiles its training step (tf.function, jax.jit), so a count captured when the step is
traced would be the first step's for every step after; a LoadBalancer's sizes change between
steps. Each backend therefore runs the weighted all-reduce as host code (its host op, host
callback, or eager call) that reads the count through `StepWeight.read` as it submits, and
the core checks it there: a bad count on one rank raises on every rank.
"""

from typing import Callable, NamedTuple, Optional

from ...common.scaling import Reduction
from ...core import collectives

__all__ = ["StepWeight", "reduce_on_host_async"]


class StepWeight(NamedTuple):
    """How a step's gradients are weighed, for the backends to apply at run time.

    Args:
        read: returns this rank's sample count for the step being run, or None for the
            plain reduction.
        reduction: the weighted average's scaling (op Average; summed passes in postscale).
    """

    read: Callable[[], Optional[float]]
    reduction: Reduction


def reduce_on_host_async(arrays, name, reduction: Reduction, process_set, weight: Optional[StepWeight] = None,
                         outputs=None):
    """Start the core's grouped all-reduce of a step's gradient arrays: weighted by the count
    `weight` reads now, else as `reduction` says. Returns the core's handle.

    Args:
        arrays: the gradients as numpy arrays.
        name: the group's name, alike on every rank.
        reduction: the plain reduction (op, prescale, postscale).
        process_set: the ranks that reduce (None: the job).
        weight: None, or the StepWeight whose count weighs this step.
        outputs: arrays to write the results into, as the core's `outputs=`.
    """
    count = None if weight is None else weight.read()
    if count is not None:
        reduction = weight.reduction
    op, prescale, postscale = reduction
    return collectives.grouped_allreduce_async(arrays, name, op, prescale, postscale, outputs=outputs,
                                               process_set=process_set, weight=count)
