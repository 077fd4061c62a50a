"""TensorFlow tensors as numpy buffers for the communication layer, eagerly and inside tf.function.

A collective is written once, as a function of numpy arrays, and `run_on_host` runs it:
eagerly at once, on `tensor.numpy()` (TensorFlow may copy the tensor to make that array;
the result becomes a new tensor, which copies again); inside a graph as a stateful
`tf.numpy_function` op that does the same when the graph runs, with the static shapes set
where they are known. TensorFlow runs stateful ops in program order within a function, so
the collectives of one graph run one after another on every rank, as traced. Being Python,
these ops cannot be compiled by XLA (tf.function(jit_compile=True)).

Names: every rank traces the same code, so an unnamed collective in a graph is named when
it is traced, after its op's place in the graph (`hvdplus_allreduce_2`). A retrace gives
the same names, however often each rank retraces (a last, shorter batch on one rank only).
Eagerly, unnamed collectives are numbered by call order, as the core numbers them
(`allreduce.7`), per process set: a set's collectives leave the job's numbering alone.
"""

import tensorflow as tf

from ..common.errors import HvdplusError, RanksFailedError, ShutdownError, StalledError, TensorMismatchError
from ..engine.process_sets import set_runtime

__all__ = ["collective_name", "what", "as_tensor", "run_on_host", "MismatchError", "AbortedError",
           "FailedPreconditionError"]


class FailedPreconditionError(HvdplusError, tf.errors.FailedPreconditionError):
    """An hvdplus error that is also the tf.errors class Horovod raises for it (ranks that
    disagree, a collective a joined rank cannot take part in)."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class MismatchError(TensorMismatchError, FailedPreconditionError):
    """TensorMismatchError, as the tf.errors.FailedPreconditionError Horovod raises."""


class AbortedError(ShutdownError, tf.errors.AbortedError):
    """A shut-down or stalled job, as the tf.errors.AbortedError Horovod raises."""

    def __init__(self, message):
        tf.errors.AbortedError.__init__(self, None, None, message)


def _as_tensorflow_error(error: HvdplusError):
    """`error` as the tf.errors class Horovod raises in its place, keeping hvdplus's class
    and message; RanksFailedError (Horovod's HorovodInternalError) stays as it is."""
    if isinstance(error, (RanksFailedError, tf.errors.OpError)):
        return error
    if isinstance(error, TensorMismatchError):
        return MismatchError(str(error))
    if isinstance(error, (ShutdownError, StalledError)):
        return AbortedError(str(error))
    return FailedPreconditionError(str(error))


def collective_name(kind: str, name=None, process_set=None) -> str:
    """`name`; else eagerly the core's next name for `kind` (`allreduce.7`) in `process_set`
    (None: the job), in a graph a name unique in it (`hvdplus_allreduce_2`, or for process
    set 3 `hvdplus_set3_allreduce_2`).

    NotInitializedError, and the core's ValueError for a set that does not include this
    rank, are raised here: when the call is made or traced, not when a graph runs."""
    live = set_runtime(process_set, f"{kind}()")
    if name is not None:
        return str(name)
    if tf.executing_eagerly():
        return live.name_for(kind, None)
    # Numbered apart per set, so that ranks whose graphs hold other sets' collectives (one
    # set's ranks trace other code than another's) still agree on the job's names.
    scope = "hvdplus" if live.is_job else f"hvdplus_set{process_set.process_set_id}"
    return tf.compat.v1.get_default_graph().unique_name(f"{scope}_{kind}")


def what(kind: str, name) -> str:
    """The collective as error messages name it."""
    return f"{kind} '{name}'" if name else kind


def as_tensor(value, description: str) -> tf.Tensor:
    """`value` as a tensor (variables are read), or TypeError naming `description`."""
    if isinstance(value, tf.Tensor):
        return value
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{description} needs a tensor, got {type(value).__name__}: {error}") from None


def run_on_host(function, tensors, dtypes, shapes):
    """The tensors `function(*arrays)` returns (a list of arrays), with `dtypes`.

    Eagerly it runs now, and hvdplus's errors surface as the tf.errors classes Horovod raises
    (see _as_tensorflow_error). In a graph it becomes an op that runs it when the graph runs;
    its outputs get the static `shapes` (a None dimension where unknown), and an error
    surfaces as the class TensorFlow gives a Python error in an op (InvalidArgumentError for
    a mismatch): only a compiled op could raise another. An op without outputs still runs:
    tf.function runs every stateful op it holds."""
    if tf.executing_eagerly():
        try:
            results = function(*[tensor.numpy() for tensor in tensors])
        except HvdplusError as error:
            raise _as_tensorflow_error(error) from error
        return [tf.convert_to_tensor(result, dtype=dtype) for result, dtype in zip(results, dtypes)]
    outputs = tf.numpy_function(function, list(tensors), list(dtypes), stateful=True)
    if not dtypes:
        return []
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return outputs
