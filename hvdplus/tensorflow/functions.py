"""Broadcasting variables from one rank, and object collectives."""

import tensorflow as tf

from ..engine import collectives
from ..engine.process_sets import global_process_set
from .buffers import collective_name, run_on_host

__all__ = ["broadcast_variables", "broadcast_object", "allgather_object"]


def broadcast_variables(variables, root_rank=0, process_set=global_process_set):
    """Assign `root_rank`'s values to every rank's `variables` (all ranks pass the same
    variables in the same order): one host op that broadcasts them all, then the assigns.

    Works eagerly and inside tf.function; Keras variables (`model.variables`) and
    MirroredStrategy's mirrored variables included.

    Args:
        variables: e.g. `model.variables`, or `model.variables + optimizer.variables`.
        root_rank: the rank whose values win: a job rank, which must belong to `process_set`.
        process_set: the ranks that take the root's values; the whole job by default.
    """
    variables = list(variables)
    name = collective_name("broadcast_variables", None, process_set)  # a rank outside the set: ValueError
    if not variables:
        return
    values = [tf.convert_to_tensor(variable) for variable in variables]

    def give(*arrays):
        handles = [collectives.broadcast_async(array, root_rank, f"{name}.{index}", process_set)
                   for index, array in enumerate(arrays)]
        return [handle.wait() for handle in handles]

    broadcast = run_on_host(give, values, [value.dtype for value in values], [value.shape for value in values])
    for variable, value in zip(variables, broadcast):
        variable.assign(value)


def broadcast_object(obj=None, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s picklable `obj` on every rank of `process_set` (eager tensors
    included); `root_rank` is a job rank. Call it eagerly, outside tf.function."""
    return collectives.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's picklable `obj`, as a list in the order of `process_set`'s ranks; call
    it eagerly."""
    return collectives.allgather_object(obj, name, process_set)
