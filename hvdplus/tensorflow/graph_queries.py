"""Horovod's query ops: the job's size and this rank's place as tensors that are read when
the graph runs, not when it is built, so a graph (tf.function, or a tf.compat.v1 graph run by
a Session) built in one job may run in another."""

import numpy as np
import tensorflow as tf

from ..core import runtime
from ..core.process_sets import includes_this_rank, size_of_id
from .buffers import run_on_host

__all__ = ["size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op",
           "PROCESS_SET_ERROR_INIT", "PROCESS_SET_ERROR_UNKNOWN_SET"]

# Horovod's answers of process_set_included_op when it cannot say 0 or 1.
PROCESS_SET_ERROR_INIT = -1
PROCESS_SET_ERROR_UNKNOWN_SET = -3


def _query(read, name):
    with tf.name_scope(name or "hvdplus_query"):
        return run_on_host(lambda: [np.int32(read())], [], [tf.int32], [tf.TensorShape([])])[0]


def size_op(process_set_id=0, name=None):
    """The number of ranks (of the process set with this id), as an int32 scalar."""
    return _query(lambda: size_of_id(process_set_id, "size_op()"), name)


def local_size_op(name=None):
    """The number of ranks on this rank's node, as an int32 scalar."""
    return _query(runtime.local_size, name)


def rank_op(name=None):
    """This rank, as an int32 scalar."""
    return _query(runtime.rank, name)


def local_rank_op(name=None):
    """This rank's place on its node, as an int32 scalar."""
    return _query(runtime.local_rank, name)


def _included(process_set_id: int) -> int:
    if not runtime.is_initialized():
        return PROCESS_SET_ERROR_INIT
    included = includes_this_rank(process_set_id, "process_set_included_op()")
    return PROCESS_SET_ERROR_UNKNOWN_SET if included is None else int(included)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank belongs to the process set with this id, else 0; -1 before init()
    and -3 for an unknown id, as Horovod answers."""
    return _query(lambda: _included(process_set_id), name)
