"""Collectives on Keras backend tensors, eager, through numpy; and the gradient all-reduce
that each backend runs inside its own training step."""

import math

import keras
import numpy as np

from ..comm import collectives
from ..common.reduce_ops import Average

__all__ = ["allreduce", "allgather", "broadcast", "broadcast_object", "allgather_object",
           "allreduce_gradients"]


def _to_numpy(value):
    return np.array(keras.ops.convert_to_numpy(value), order="C")  # keeps 0-d shapes


def allreduce(value, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """All-reduce a backend tensor (eager); returns a backend tensor."""
    result = collectives.allreduce(_to_numpy(value), op, prescale_factor, postscale_factor, name=name)
    return keras.ops.convert_to_tensor(result)


def allgather(value, name=None):
    """Every rank's `value` concatenated along the first axis."""
    return keras.ops.convert_to_tensor(collectives.allgather(_to_numpy(value), name=name))


def broadcast(value, root_rank=0, name=None):
    """`root_rank`'s `value` on every rank."""
    return keras.ops.convert_to_tensor(collectives.broadcast(_to_numpy(value), root_rank, name=name))


def broadcast_object(obj=None, root_rank=0, name=None):
    return collectives.broadcast_object(obj, root_rank, name)


def allgather_object(obj, name=None):
    return collectives.allgather_object(obj, name)


def allreduce_gradients(grads, variables, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """All-reduce a training step's gradients as one fused group, on whatever the backend
    hands the optimizer: TensorFlow tensors inside `tf.function`, torch tensors eagerly,
    JAX tracers inside `jax.jit`.
    `None` gradients stay None (every rank's model has the same unused variables)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    backend = keras.backend.backend()
    tensors = [grads[i] for i in present]
    group = "keras." + _variable_name(variables, present[0])
    if backend == "tensorflow":
        from .. import tensorflow as hvd_tf

        reduced = hvd_tf.grouped_allreduce(tensors, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, name=group)
    elif backend == "torch":
        reduced = _torch_grouped_allreduce(tensors, [variables[i] for i in present], op, prescale_factor,
                                           postscale_factor, group)
    elif backend == "jax":
        reduced = _jax_grouped_allreduce(tensors, op, prescale_factor, postscale_factor, group)
    else:
        raise NotImplementedError(
            f"hvdplus.keras all-reduces gradients on the tensorflow, torch and jax backends, not {backend!r}"
        )
    result = list(grads)
    for index, tensor in zip(present, reduced):
        result[index] = tensor
    return result


def _variable_name(variables, index):
    return getattr(variables[index], "path", None) or f"variable.{index}"


def _torch_grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, group):
    from .. import torch as hvd_torch

    if all(tensor is getattr(variable.value, "grad", None) for tensor, variable in zip(tensors, variables)):
        # model.fit hands the variables' own .grad, which Keras clears before the next pass:
        # reduced where they lie (no packing copy), as torch's DistributedOptimizer does.
        return hvd_torch.grouped_allreduce_(tensors, op=op, prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor, name=group)
    # Gradients of a custom loop stay untouched; the results are views of the group's
    # packed buffer, with no copy back.
    return hvd_torch.grouped_allreduce([t.detach().contiguous() for t in tensors], op=op,
                                       prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                       name=group)


def _jax_grouped_allreduce(tensors, op, prescale_factor, postscale_factor, group):
    """The JAX trainer applies gradients inside `jax.jit`, where they are tracers: they leave
    the compiled step through a host callback, packed into one array by the step itself,
    since every array crossing a callback costs a conversion each way (an 8 x 256 MLP's
    model.fit on 2 ranks ran at about 0.3 of independent ranks with its 18 gradients passed
    one by one, near 0.5 packed). On the host the packed array is reduced as a group of
    views of its members, so that ranks still compare every member's shape (two models whose
    gradients merely add up to the same length must not be summed). `io_callback`, because
    JAX may drop or repeat a `pure_callback`, and a collective must run exactly once per step
    on every rank; `ordered` keeps it in program order with any other callback."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback

    packed_dtype = jnp.result_type(*tensors)
    packed = jnp.concatenate([jnp.ravel(t).astype(packed_dtype) for t in tensors])
    shapes = [tuple(t.shape) for t in tensors]

    def reduce_on_host(array):
        reduced = np.empty(array.shape, array.dtype)
        collectives.grouped_allreduce_async(_members_of(np.asarray(array), shapes), group, op, prescale_factor,
                                            postscale_factor, outputs=_members_of(reduced, shapes)).wait()
        return reduced

    reduced = io_callback(reduce_on_host, jax.ShapeDtypeStruct(packed.shape, packed_dtype), packed, ordered=True)
    return [piece.astype(t.dtype) for piece, t in zip(_members_of(reduced, shapes), tensors)]


def _members_of(packed, shapes):
    """Views (or slices, for JAX arrays) of a flat array holding members of `shapes` end to end."""
    members, start = [], 0
    for shape in shapes:
        count = math.prod(shape)
        members.append(packed[start:start + count].reshape(shape))
        start += count
    return members
