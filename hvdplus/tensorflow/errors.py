"""hvdplus's errors as the tf.errors classes Horovod's TensorFlow ops raise: each class here is
both, so a script may catch either. Eagerly, `buffers.run_on_host` raises a collective's error
as one of them (`as_tensorflow_error`); in a graph, see graph_errors.py.

Each takes TensorFlow's arguments (node_def, op, message): autograph re-raises an error raised
while it traces a tf.function by calling its class with those, and any other class would come
out as its StagingError.
"""

import tensorflow as tf

from ..common.errors import (
    CollectiveArgumentError, HvdplusError, RanksFailedError, ShutdownError, StalledError, TensorMismatchError,
)

__all__ = ["FailedPreconditionError", "MismatchError", "InvalidArgumentError", "AbortedError", "as_tensorflow_error"]


class FailedPreconditionError(HvdplusError, tf.errors.FailedPreconditionError):
    """An hvdplus error that is also the tf.errors class Horovod raises for it (ranks that
    disagree, a collective a joined rank cannot take part in)."""

    def __init__(self, node_def, op, message, *args):
        tf.errors.FailedPreconditionError.__init__(self, node_def, op, message, *args)


class MismatchError(TensorMismatchError, FailedPreconditionError):
    """TensorMismatchError, as the tf.errors.FailedPreconditionError Horovod raises."""


class InvalidArgumentError(CollectiveArgumentError, tf.errors.InvalidArgumentError):
    """An argument some rank refused (an alltoall its ranks cannot split evenly, a root
    rank out of range), raised on every rank as the tf.errors.InvalidArgumentError Horovod
    raises; still the core's CollectiveArgumentError (a ValueError and a RuntimeError)."""

    def __init__(self, node_def, op, message, *args):
        tf.errors.InvalidArgumentError.__init__(self, node_def, op, message, *args)


class AbortedError(ShutdownError, tf.errors.AbortedError):
    """A shut-down or stalled job, as the tf.errors.AbortedError Horovod raises."""

    def __init__(self, node_def, op, message, *args):
        tf.errors.AbortedError.__init__(self, node_def, op, message, *args)


def as_tensorflow_error(error):
    """`error` (an HvdplusError or a ValueError) as the tf.errors class Horovod raises in its
    place, keeping hvdplus's class and message; RanksFailedError (Horovod's
    HorovodInternalError) stays as it is."""
    if isinstance(error, (RanksFailedError, tf.errors.OpError)):
        return error
    if not isinstance(error, HvdplusError):
        return InvalidArgumentError(None, None, str(error))
    if isinstance(error, TensorMismatchError):
        return MismatchError(None, None, str(error))
    if isinstance(error, (ShutdownError, StalledError)):
        return AbortedError(None, None, str(error))
    return FailedPreconditionError(None, None, str(error))

