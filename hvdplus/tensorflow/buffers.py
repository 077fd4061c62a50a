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

import numpy as np
import tensorflow as tf

from ..common.errors import HvdplusError
from .errors import as_tensorflow_error

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
    unknown), and an error surfaces as the class TensorFlow gives a Python error in an op
    (InvalidArgumentError for a mismatch): only a compiled op could raise another. An op
    without outputs still runs in a tf.function, which runs every stateful op it holds."""
    if tf.executing_eagerly():
        try:
            results = function(*[tensor.numpy() for tensor in tensors])
        except (HvdplusError, ValueError) as error:
            raise as_tensorflow_error(error) from error
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
