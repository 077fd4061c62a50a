"""Keras' JAX trainer applies gradients inside `jax.jit`, where they are tracers: they leave
the compiled step through a host callback, packed into one array by the step itself, since
every array crossing a callback costs a conversion each way, which for a step's many
gradients passed one by one costs far more than packing them. On the host the packed array
is reduced as a group of views of its members, so that ranks still compare every member's
shape (two models whose gradients merely add up to the same length must not be summed).
`io_callback`, because JAX may drop or repeat a `pure_callback`, and a collective must run
exactly once per step on every rank; `ordered` keeps it in program order with any other
callback."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from ...core import collectives


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None):
    packed_dtype = jnp.result_type(*tensors)
    packed = jnp.concatenate([jnp.ravel(t).astype(packed_dtype) for t in tensors])
    shapes = [tuple(t.shape) for t in tensors]

    def reduce_on_host(array):
        reduced = np.empty(array.shape, array.dtype)
        collectives.grouped_allreduce_async(members_of(np.asarray(array), shapes), name, op, prescale_factor,
                                            postscale_factor, outputs=members_of(reduced, shapes),
                                            process_set=process_set).wait()
        return reduced

    reduced = io_callback(reduce_on_host, jax.ShapeDtypeStruct(packed.shape, packed_dtype), packed, ordered=True)
    return [piece.astype(t.dtype) for piece, t in zip(members_of(reduced, shapes), tensors)]


def members_of(packed, shapes):
    """Views (or slices, for JAX arrays) of a flat array holding members of `shapes` end to end."""
    members, start = [], 0
    for shape in shapes:
        count = math.prod(shape)
        members.append(packed[start:start + count].reshape(shape))
        start += count
    return members
