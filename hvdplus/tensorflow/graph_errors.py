"""How a collective in a graph (a tf.function, or a tf.compat.v1 graph run by a Session) raises
tf.errors.FailedPreconditionError, the class Horovod raises for ranks that disagree.

The collective runs in a Python host function, and TensorFlow gives every Python error there
a class of its own (InvalidArgumentError for a ValueError, UnknownError for the rest), whatever
the error was. One op that is not Python raises FailedPreconditionError with a message taken
from a tensor: reading a variable that does not exist, whose message quotes the variable's
name. So the host function returns such an error as a status beside its results, the handle
of a missing variable named by hvdplus's message (`reporting_host`), and the graph reads that
variable when the status is set (`raise_reported`): the Session or the tf.function raises
FailedPreconditionError, its message TensorFlow's words for a missing variable around
hvdplus's. Other errors stay Python errors.
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import resource_handle_pb2, tensor_pb2

from ..common.errors import HvdplusError
from .errors import as_tensorflow_error

__all__ = ["handle_template", "reporting_host", "raise_reported"]

# The variable whose handle a failed host op copies and renames; it is never created.
_UNREAD_VARIABLE = "hvdplus_graph_error"


def handle_template() -> tf.Tensor:
    """The serialized handle of a variable on this host, for `reporting_host` to rename: a
    handle is only read where its device and its type say, which the template carries."""
    with tf.device("/cpu:0"):
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name=_UNREAD_VARIABLE)
        return tf.raw_ops.SerializeTensor(tensor=handle)


def reporting_host(function, dtypes, shapes):
    """`function` (arrays -> arrays of `dtypes`) as a host function for a graph that takes
    `handle_template()`'s value first and returns `function`'s arrays and a status: empty, or
    when `function` raised an error that is a FailedPreconditionError eagerly, the handle of a
    missing variable named by the error's message (the arrays are then zeros of the static
    `shapes`). Other errors are raised as eagerly."""

    @tf.autograph.experimental.do_not_convert  # plain Python: converting it only slows each call
    def host(template, *arrays):
        try:
            return list(function(*arrays)) + [np.bytes_(b"")]
        except (HvdplusError, ValueError) as error:
            as_tensorflow = as_tensorflow_error(error)
            if not isinstance(as_tensorflow, tf.errors.FailedPreconditionError):
                raise as_tensorflow from error
            placeholders = [_zeros(dtype, shape) for dtype, shape in zip(dtypes, shapes)]
            return placeholders + [np.bytes_(_missing_variable(template, str(as_tensorflow)))]

    return host


def raise_reported(status, outputs):
    """`outputs` (a list), once the host op's `status` says it succeeded; else the op that
    gives them raises its FailedPreconditionError. The status passes through too, so that a
    collective without outputs still has an op, which a tf.function runs."""
    passed = list(outputs) + [status]

    def fail():
        with tf.device("/cpu:0"):
            handle = tf.raw_ops.ParseTensor(serialized=status, out_type=tf.resource)
            missing = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
        # Every output is made of the read: TensorFlow prunes a read that only a control
        # dependency asks for.
        return ([tf.fill(tf.shape(tensor), tf.cast(missing, tensor.dtype)) for tensor in outputs]
                + [tf.strings.as_string(missing)])

    checked = tf.cond(tf.strings.length(status) > 0, fail, lambda: [tf.identity(tensor) for tensor in passed])
    for tensor, given in zip(checked, passed):
        tensor.set_shape(given.shape)
    if not outputs:
        # Nothing uses the check, and a tf.function runs only what is used or stateful: a
        # stateful op that always holds uses it.
        tf.raw_ops.Assert(condition=tf.strings.length(checked[-1]) >= 0, data=[checked[-1]])
    return checked[:-1]


def _zeros(dtype, shape: tf.TensorShape) -> np.ndarray:
    """Zeros that fit `shape` (an unknown dimension: 0)."""
    dims = [] if shape.rank is None else [0 if n is None else n for n in shape.as_list()]
    return np.zeros(dims, dtype.as_numpy_dtype)


def _missing_variable(template: bytes, message: str) -> bytes:
    """The serialized handle `template` (a scalar DT_RESOURCE TensorProto) with `message` as
    its variable's name."""
    content = tensor_pb2.TensorProto.FromString(template).tensor_content
    length, start = _varint(content)  # one handle: its length, then the handle itself
    handle = resource_handle_pb2.ResourceHandleProto.FromString(content[start:start + length])
    handle.name = message
    proto = tensor_pb2.TensorProto(dtype=tf.resource.as_datatype_enum, resource_handle_val=[handle])
    proto.tensor_shape.SetInParent()
    return proto.SerializeToString()


def _varint(data: bytes):
    """(the protobuf varint at the start of `data`, where what follows it starts)."""
    value = shift = index = 0
    while True:
        byte = data[index]
        value |= (byte & 0x7F) << shift
        index, shift = index + 1, shift + 7
        if byte < 0x80:
            return value, index
