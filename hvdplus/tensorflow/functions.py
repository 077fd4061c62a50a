"""Broadcasting variables from one rank, and object collectives."""

import tensorflow as tf

from ..engine import collectives
from .buffers import collective_name, run_on_host

__all__ = ["broadcast_variables", "broadcast_object", "allgather_object"]


def broadcast_variables(variables, root_rank=0):
    """Assign `root_rank`'s values to every rank's `variables` (all ranks pass the same
    variables in the same order): one host op that broadcasts them all, then the assigns.

    Works eagerly and inside tf.function; Keras variables (`model.variables`) and
    MirroredStrategy's mirrored variables included.

    Args:
        variables: e.g. `model.variables`, or `model.variables + optimizer.variables`.
        root_rank: the rank whose values win.
    """
    variables = list(variables)
    if not variables:
        return
    name = collective_name("broadcast_variables")
    values = [tf.convert_to_tensor(variable) for variable in variables]

    def give(*arrays):
        handles = [collectives.broadcast_async(array, root_rank, f"{name}.{index}")
                   for index, array in enumerate(arrays)]
        return [handle.wait() for handle in handles]

    broadcast = run_on_host(give, values, [value.dtype for value in values], [value.shape for value in values])
    for variable, value in zip(variables, broadcast):
        variable.assign(value)


def broadcast_object(obj=None, root_rank=0, name=None):
    """`root_rank`'s picklable `obj` on every rank (eager tensors included); call it
    eagerly, outside tf.function."""
    return collectives.broadcast_object(obj, root_rank, name)


def allgather_object(obj, name=None):
    """Every rank's picklable `obj`, as a list in rank order; call it eagerly."""
    return collectives.allgather_object(obj, name)
