"""Point-to-point messages on TensorFlow tensors, eagerly and inside tf.function (see
hvdplus.core.p2p for the checks, order and completion rules).

    if hvd.rank() == 0:
        hvd.send(activations, dst=1, tag=7)
    else:
        activations = hvd.recv([32, 128], src=0, tag=7)        # tf.float32 unless dtype=...

Inside a tf.function each call is a stateful op that sends or receives when the graph
runs, in program order with the function's other hvdplus ops; an error (a mismatch with
the peer, a bad argument) surfaces as the tf.errors.OpError TensorFlow makes of it.

These are not differentiable: `recv` gives a tensor with no gradient, and `send` returns
None. (A receiving rank's tape would only run a gradient function of `recv` if one of the
tape's sources were upstream of it, which nothing is; a symmetric gradient, as in
hvdplus.torch, has no place to hook into.) To send a gradient back, compute it on the
receiver, `grad = tape.gradient(loss, received)` after `tape.watch(received)`, and send
it as an ordinary message.
"""

import tensorflow as tf

from ..core import p2p
from .buffers import as_tensor, run_on_host

__all__ = ["send", "recv"]


def send(tensor, dst, tag=0, process_set=None):
    """Send `tensor` to job rank `dst`; eagerly, returns once `dst` has it. Returns None."""
    tensor = as_tensor(tensor, f"send to rank {dst}")

    def give(array):
        p2p.send(array, dst, tag, process_set)
        return []

    run_on_host(give, [tensor], [], [])


def recv(tensor_or_shape, src, tag=0, dtype=None, process_set=None):
    """A new tensor received from job rank `src`, of the shape and dtype of
    `tensor_or_shape` when it is a tensor or variable (TensorFlow tensors are immutable,
    so it is only a template), else of that shape and `dtype` (default tf.float32)."""
    what = f"recv from rank {src}"
    if isinstance(tensor_or_shape, (tf.Tensor, tf.Variable)):
        template = as_tensor(tensor_or_shape, what)
        if dtype is not None and tf.as_dtype(dtype) != template.dtype:
            raise ValueError(f"{what}: dtype {tf.as_dtype(dtype).name} differs from the tensor's "
                             f"{template.dtype.name}")
        name = template.dtype.name

        def take_like(shape):
            return [p2p.recv(tuple(int(n) for n in shape), src, tag, name, process_set)]

        return run_on_host(take_like, [tf.shape(template)], [template.dtype], [template.shape])[0]
    shape = tf.TensorShape([tensor_or_shape] if isinstance(tensor_or_shape, int) else tensor_or_shape)
    if not shape.is_fully_defined():
        raise ValueError(f"{what}: shape {shape} is not fully defined; pass a template tensor")
    dtype = tf.float32 if dtype is None else tf.as_dtype(dtype)

    def take():
        return [p2p.recv(tuple(shape.as_list()), src, tag, dtype.name, process_set)]

    return run_on_host(take, [], [dtype], [shape])[0]
