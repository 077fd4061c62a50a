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
"""

import tensorflow as tf

from ..common.errors import HvdplusError
from .errors import as_tensorflow_error
from .graph_errors import handle_template, raise_reported, reporting_host

__all__ = ["as_tensor", "run_on_host"]


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
    errors.as_tensorflow_error). In a graph it becomes an op that runs it when the graph runs (see
    the module's docstring); its outputs get the static `shapes` (a None dimension where
    unknown); an error that is a FailedPreconditionError eagerly (a mismatch) surfaces as
    one there too (graph_errors.py says how), others as the class TensorFlow gives a Python error
    in an op (InvalidArgumentError for a ValueError). An op without outputs still runs in a
    tf.function, which runs every stateful op it holds."""
    if tf.executing_eagerly():
        try:
            results = function(*[tensor.numpy() for tensor in tensors])
        except (HvdplusError, ValueError) as error:
            raise as_tensorflow_error(error) from error
        return [tf.convert_to_tensor(result, dtype=dtype) for result, dtype in zip(results, dtypes)]
    dtypes, shapes = list(dtypes), [tf.TensorShape(shape) for shape in shapes]
    # The host function reports a FailedPreconditionError as a status (see graph_errors.py).
    host = reporting_host(function, dtypes, shapes)
    inputs, types, output_shapes = [handle_template(), *tensors], [*dtypes, tf.string], [*shapes, tf.TensorShape([])]
    if tf.compat.v1.executing_eagerly_outside_functions():  # a tf.function: its ops run in program order
        outputs = tf.numpy_function(host, inputs, types, stateful=True)
        for output, shape in zip(outputs, output_shapes):
            output.set_shape(shape)
    else:
        outputs = _asynchronous_op(host, inputs, types, output_shapes)
    return raise_reported(outputs[len(dtypes)], outputs[:len(dtypes)])


def _asynchronous_op(function, tensors, dtypes, shapes):
    """`function` as a `DatasetToSingleElement` op of a dataset that maps its one element
    (`tensors`, never empty) with it: the op frees its inter-op thread while `function` runs."""

    def element(*values):
        results = tf.numpy_function(function, list(values), dtypes, stateful=True)
        for result, shape in zip(results, shapes):
            result.set_shape(shape)
        return results

    signature = [tf.TensorSpec(tensor.shape, tensor.dtype) for tensor in tensors]
    mapping = tf.function(element, input_signature=signature, autograph=False).get_concrete_function()
    dataset = tf.raw_ops.TensorDataset(components=tensors, output_shapes=[tensor.shape for tensor in tensors])
    mapped = tf.raw_ops.MapDataset(input_dataset=dataset, other_arguments=[], f=mapping, output_types=dtypes,
                                   output_shapes=shapes, use_inter_op_parallelism=False, preserve_cardinality=True)
    return tf.raw_ops.DatasetToSingleElement(dataset=mapped, output_types=dtypes, output_shapes=shapes)
