"""TensorFlow tensors as numpy buffers for the communication layer, eagerly and in graphs.

A collective is written once, as a function of numpy arrays, and `run_on_host` runs it:
eagerly at once, on `tensor.numpy()` (TensorFlow may copy the tensor to make that array;
the result becomes a new tensor, which copies again); in a graph as an op that does the same
when the graph runs, with the static shapes set where they are known. Being Python, these
ops cannot be compiled by XLA (tf.function(jit_compile=True)).

A collective blocks until every rank has submitted it, so the ops must not depend on the
order TensorFlow picks for independent ops, which may differ between ranks. In a
tf.function (called eagerly) automatic control dependencies run stateful ops in program
order, so there each collective is a stateful `tf.numpy_function` op, run one after another
on every rank, as traced. A graph without them (a tf.compat.v1 graph run by a Session, and
functions called from one) leaves that order open, and a `tf.numpy_function` blocks one of
the few inter-op threads while it waits: with two ranks' threads each waiting for a
collective the other has not reached, neither goes on. There the op is asynchronous, as
Horovod's kernels are: the host function maps the one element of a tf.data dataset, read
by `DatasetToSingleElement`, a kernel that runs it on a thread of tf.data's own unbounded
pool (the map runs on that thread, `use_inter_op_parallelism` off) and frees its inter-op
thread at once. No inter-op thread then waits for another rank, so every collective whose
inputs are ready is submitted, in whatever order, and the engine pairs them by name.

Names: every rank traces the same code, so an unnamed collective in a graph is named when
it is traced, after its op's place in the graph (`hvdplus_allreduce_2`). A retrace gives
the same names, however often each rank retraces (a last, shorter batch on one rank only).
Eagerly, unnamed collectives are numbered by call order, as the core numbers them
(`allreduce.7`), per process set: a set's collectives leave the job's numbering alone.
"""

import numpy as np
import tensorflow as tf

from ..common.errors import (
    CollectiveArgumentError, HvdplusError, RanksFailedError, ShutdownError, StalledError, TensorMismatchError,
)
from ..core.process_sets import is_job, name_in, require_member

__all__ = ["collective_name", "what", "as_tensor", "run_on_host", "MismatchError", "AbortedError",
           "FailedPreconditionError", "InvalidArgumentError"]


class FailedPreconditionError(HvdplusError, tf.errors.FailedPreconditionError):
    """An hvdplus error that is also the tf.errors class Horovod raises for it (ranks that
    disagree, a collective a joined rank cannot take part in)."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class MismatchError(TensorMismatchError, FailedPreconditionError):
    """TensorMismatchError, as the tf.errors.FailedPreconditionError Horovod raises."""


class InvalidArgumentError(CollectiveArgumentError, tf.errors.InvalidArgumentError):
    """An argument some rank refused (an alltoall its ranks cannot split evenly, a root
    rank out of range), raised on every rank as the tf.errors.InvalidArgumentError Horovod
    raises; still the core's CollectiveArgumentError (a ValueError and a RuntimeError)."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class AbortedError(ShutdownError, tf.errors.AbortedError):
    """A shut-down or stalled job, as the tf.errors.AbortedError Horovod raises."""

    def __init__(self, message):
        tf.errors.AbortedError.__init__(self, None, None, message)


def _as_tensorflow_error(error):
    """`error` (an HvdplusError or a ValueError) as the tf.errors class Horovod raises in its
    place, keeping hvdplus's class and message; RanksFailedError (Horovod's
    HorovodInternalError) stays as it is."""
    if isinstance(error, (RanksFailedError, tf.errors.OpError)):
        return error
    if not isinstance(error, HvdplusError):
        return InvalidArgumentError(str(error))
    if isinstance(error, TensorMismatchError):
        return MismatchError(str(error))
    if isinstance(error, (ShutdownError, StalledError)):
        return AbortedError(str(error))
    return FailedPreconditionError(str(error))


def collective_name(kind: str, name=None, process_set=None) -> str:
    """`name`; else eagerly the core's next name for `kind` (`allreduce.7`) in `process_set`
    (None: the job), in a graph a name unique in it (`hvdplus_allreduce_2`, or for process
    set 3 `hvdplus_set3_allreduce_2`): in a tf.function, unique in the function; in a
    tf.compat.v1 graph, unique in it and the functions it holds.

    NotInitializedError, and the core's ValueError for a set that does not include this
    rank, are raised here: when the call is made or traced, not when a graph runs."""
    require_member(process_set, f"{kind}()")
    if name is not None:
        return str(name)
    if tf.executing_eagerly():
        return name_in(process_set, kind, None, f"{kind}()")
    # Numbered apart per set, so that ranks whose graphs hold other sets' collectives (one
    # set's ranks trace other code than another's) still agree on the job's names.
    scope = "hvdplus" if is_job(process_set) else f"hvdplus_set{process_set.process_set_id}"
    graph = tf.compat.v1.get_default_graph()
    if not tf.compat.v1.executing_eagerly_outside_functions():
        # The functions a tf.compat.v1 graph holds (tf.cond's branches, tf.function) run
        # beside its other ops, so their collectives take names unique in that whole graph.
        while getattr(graph, "outer_graph", None) is not None:
            graph = graph.outer_graph
    return graph.unique_name(f"{scope}_{kind}")


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

    Eagerly it runs now, and errors surface as the tf.errors classes Horovod raises (see
    _as_tensorflow_error). In a graph it becomes an op that runs it when the graph runs (see
    the module's docstring); its outputs get the static `shapes` (a None dimension where
    unknown), and an error surfaces as the class TensorFlow gives a Python error in an op
    (InvalidArgumentError for a mismatch): only a compiled op could raise another. An op
    without outputs still runs in a tf.function, which runs every stateful op it holds."""
    if tf.executing_eagerly():
        try:
            results = function(*[tensor.numpy() for tensor in tensors])
        except (HvdplusError, ValueError) as error:
            raise _as_tensorflow_error(error) from error
        return [tf.convert_to_tensor(result, dtype=dtype) for result, dtype in zip(results, dtypes)]
    tensors, dtypes, shapes = list(tensors), list(dtypes), [tf.TensorShape(shape) for shape in shapes]
    if tf.compat.v1.executing_eagerly_outside_functions():  # a tf.function: its ops run in program order
        outputs = tf.numpy_function(function, tensors, dtypes, stateful=True)
        if not dtypes:
            return []
        for output, shape in zip(outputs, shapes):
            output.set_shape(shape)
        return outputs
    return _asynchronous_op(function, tensors, dtypes, shapes)[:len(dtypes)]


def _asynchronous_op(function, tensors, dtypes, shapes):
    """`function` as a `DatasetToSingleElement` op of a dataset that maps its one element
    (`tensors`) with it: the op frees its inter-op thread while `function` runs. An
    element needs a component, and a map an output, so a scalar stands in for none."""
    inputs = tensors or [tf.zeros([], tf.int8)]
    types, element_shapes = (dtypes, shapes) if dtypes else ([tf.int8], [tf.TensorShape([])])

    def host(*arrays):
        results = function(*arrays[:len(tensors)])
        return results if dtypes else [np.int8(0)]

    def element(*values):
        results = tf.numpy_function(host, list(values), types, stateful=True)
        for result, shape in zip(results, element_shapes):
            result.set_shape(shape)
        return results

    signature = [tf.TensorSpec(tensor.shape, tensor.dtype) for tensor in inputs]
    mapping = tf.function(element, input_signature=signature, autograph=False).get_concrete_function()
    dataset = tf.raw_ops.TensorDataset(components=inputs, output_shapes=[tensor.shape for tensor in inputs])
    mapped = tf.raw_ops.MapDataset(input_dataset=dataset, other_arguments=[], f=mapping, output_types=types,
                                   output_shapes=element_shapes, use_inter_op_parallelism=False,
                                   preserve_cardinality=True)
    return tf.raw_ops.DatasetToSingleElement(dataset=mapped, output_types=types, output_shapes=element_shapes)
