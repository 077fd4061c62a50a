"""DistributedGradientTape: `gradient()` returns gradients averaged over all ranks.

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

All gradients of one `gradient()` call go to the engine together, in one host op: the
dense ones as one fused group, the IndexedSlices (embeddings, tf.gather) as allgathers, or
densified first with sparse_as_dense=True. Eagerly every call uses the same name, so after
the first step the engine's response cache knows it; in a tf.function the op is named
when traced. Gradients that are None (variables the loss does not use) stay None and are
not sent: every rank must have the same ones.
"""

import tensorflow as tf

from ..common.reduce_ops import Average, Sum, as_reduce_op
from ..common.scaling import gradient_reduction
from ..engine import runtime
from .compression import Compression
from .mpi_ops import grouped_allreduce

__all__ = ["DistributedGradientTape"]


class _DistributedGradientTape:
    """Mixed in before the wrapped tape's class, so the result is still that kind of tape."""

    def _hvdplus_setup(self, compression, sparse_as_dense, op, gradient_predivide_factor):
        op = as_reduce_op(op)
        if op not in (Average, Sum):
            raise ValueError(f"DistributedGradientTape takes op Average or Sum, got {op.label}")
        self._reduction = gradient_reduction(op, gradient_predivide_factor, runtime.size())
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients, all-reduced over every rank; same structure as `sources`."""
        gradients = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(gradients)
        present = [index for index, grad in enumerate(flat) if grad is not None]
        if not present:
            return gradients
        grads = [flat[index] for index in present]
        if self._sparse_as_dense:
            grads = [tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad for grad in grads]
        op, prescale, postscale = self._reduction
        name = "DistributedGradientTape" if tf.executing_eagerly() else None
        reduced = grouped_allreduce(grads, compression=self._compression, op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, name=name)
        for index, grad in zip(present, reduced):
            flat[index] = grad
        return tf.nest.pack_sequence_as(gradients, flat)


def DistributedGradientTape(gradtape, compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0):
    """Wrap `gradtape` (recorded or not yet entered) so that `gradient()` all-reduces.

    Args:
        gradtape: a tf.GradientTape; what it recorded, and whether it is persistent, carry over.
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        sparse_as_dense: densify IndexedSlices gradients instead of allgathering them.
        op: Average (default) or Sum over ranks.
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
    """
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(gradtape.__dict__)
    wrapped._hvdplus_setup(compression, sparse_as_dense, op, gradient_predivide_factor)
    return wrapped
