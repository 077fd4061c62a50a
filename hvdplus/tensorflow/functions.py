"""Broadcasting variables from one rank (eagerly, in tf.function and in tf.compat.v1 graphs),
and object collectives."""

import tensorflow as tf

from ..core import collectives
from ..core.process_sets import global_process_set
from .buffers import run_on_host
from .collective_names import collective_name, require_member

__all__ = ["broadcast_variables", "broadcast_", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
           "broadcast_object", "allgather_object"]


def broadcast_variables(variables, root_rank=0, process_set=global_process_set):
    """Assign `root_rank`'s values to every rank's `variables` (all ranks pass the same
    variables in the same order): one host op that broadcasts them all, then the assigns.

    Works eagerly and inside tf.function; Keras variables (`model.variables`) and
    MirroredStrategy's mirrored variables included. In a tf.compat.v1 graph it returns the
    op that does it, to run in a Session.

    Args:
        variables: e.g. `model.variables`, or `model.variables + optimizer.variables`.
        root_rank: the rank whose values win: a job rank, which must belong to `process_set`.
        process_set: the ranks that take the root's values; the whole job by default.
    """
    variables = list(variables)
    name = collective_name("broadcast_variables", None, process_set)  # a rank outside the set raises here
    if not variables:
        return
    values = [tf.convert_to_tensor(variable) for variable in variables]

    def give(*arrays):
        handles = [collectives.broadcast_async(array, root_rank, f"{name}.{index}", process_set)
                   for index, array in enumerate(arrays)]
        return [handle.wait() for handle in handles]

    broadcast = run_on_host(give, values, [value.dtype for value in values], [value.shape for value in values])
    assigns = [variable.assign(value) for variable, value in zip(variables, broadcast)]
    # A tf.compat.v1 graph runs only the ops asked for; tf.function runs all of them.
    return None if tf.executing_eagerly() or tf.inside_function() else tf.group(*assigns)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: `root_rank`'s values assigned to `variables`; returns
    their new values. `name` is accepted for Horovod's signature."""
    variables = list(variables)
    done = broadcast_variables(variables, root_rank, process_set)
    with tf.control_dependencies([done] if done is not None else []):
        return [variable.read_value() if hasattr(variable, "read_value") else tf.identity(variable)
                for variable in variables]


def broadcast_global_variables(root_rank):
    """The op that gives every rank `root_rank`'s values of the graph's global variables, for
    tf.compat.v1 graph programs; eagerly there are no global variables, as Horovod says."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook (tf.compat.v1.train.MonitoredTrainingSession, Estimator) that gives
    every rank `root_rank`'s global variables once the session exists. `device` is accepted
    for Horovod's signature; hvdplus broadcasts from host memory."""

    def __init__(self, root_rank, device="", process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_variables(tf.compat.v1.global_variables(), self.root_rank, self.process_set)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def broadcast_object(obj=None, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s picklable `obj` on every rank of `process_set` (eager tensors
    included); `root_rank` is a job rank. Call it eagerly, outside tf.function."""
    require_member(process_set, "broadcast_object()")
    return collectives.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's picklable `obj`, as a list in the order of `process_set`'s ranks; call
    it eagerly."""
    require_member(process_set, "allgather_object()")
    return collectives.allgather_object(obj, name, process_set)
