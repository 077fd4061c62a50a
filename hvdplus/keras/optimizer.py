"""DistributedOptimizer for Keras 3: every optimizer, every backend that hvdplus bridges.

Keras 3 routes every update through `Optimizer.apply(grads, trainable_variables)` on all
backends (model.fit, custom loops, `apply_gradients`), so overriding it sees the gradients
wherever they come from. The wrapped optimizer is an instance of a subclass of the user's
optimizer class that keeps its name and configuration, so `model.save` writes the plain
optimizer and `hvdplus.keras.load_model` wraps it again.
"""

import weakref

from ..common.reduce_ops import Average
from ..common.scaling import Reduction, gradient_reduction
from ..engine import runtime
from .compression import Compression
from .mpi_ops import allreduce_gradients

__all__ = ["DistributedOptimizer", "distributed_class"]

_CLASSES = {}


class _DistributedOptimizer:
    """Mixed in before a Keras optimizer class."""

    _hvdplus_reduction = Reduction(Average)
    _hvdplus_compression = Compression.none

    def _hvdplus_configure(self, op, backward_passes_per_step, average_aggregated_gradients,
                           gradient_predivide_factor, compression=None):
        self._hvdplus_compression = compression or Compression.none
        self._hvdplus_options = (op, gradient_predivide_factor, backward_passes_per_step, average_aggregated_gradients)
        if backward_passes_per_step > 1:
            self.gradient_accumulation_steps = backward_passes_per_step
        self._hvdplus_scale_to_size()
        if "_hvdplus_detach_from_reforms" not in vars(self):
            # A job that re-forms (hvdplus.elastic) has a new size, which the scale follows.
            this = weakref.ref(self)
            self._hvdplus_detach_from_reforms = runtime.on_reform(
                lambda: this() is not None and this()._hvdplus_scale_to_size())

    def _hvdplus_scale_to_size(self):
        """The reduction for the job's size (gradient_predivide_factor divides by it)."""
        op, gradient_predivide_factor, backward_passes_per_step, average_aggregated_gradients = self._hvdplus_options
        reduction = gradient_reduction(op, gradient_predivide_factor, runtime.size())
        if backward_passes_per_step > 1 and not average_aggregated_gradients:
            # Keras' own accumulation averages the passes; Horovod's default sums them.
            reduction = reduction._replace(postscale=reduction.postscale * backward_passes_per_step)
        self._hvdplus_reduction = reduction

    def apply(self, grads, trainable_variables=None):
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        if runtime.size() > 1:
            op, prescale, postscale = self._hvdplus_reduction
            compression = self._hvdplus_compression
            # Without compression a gradient stays the very tensor (torch's .grad, reduced in place).
            wires = [(None, None) if g is None else compression.compress(g) for g in grads]
            reduced = allreduce_gradients([wire for wire, _ in wires], list(variables), op, prescale, postscale)
            grads = [r if r is None else compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, wires)]
        return super().apply(grads, trainable_variables)


def distributed_class(optimizer_class):
    """The hvdplus subclass of a Keras optimizer class (one per class, kept)."""
    cls = _CLASSES.get(optimizer_class)
    if cls is None:
        cls = type(optimizer_class.__name__, (_DistributedOptimizer, optimizer_class), {
            "__module__": optimizer_class.__module__,
            "__doc__": optimizer_class.__doc__,
        })
        _CLASSES[optimizer_class] = cls
    return cls


def DistributedOptimizer(optimizer, compression=None, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, gradient_predivide_factor=1.0,
                         sparse_as_dense=False):
    """Wrap a Keras 3 optimizer so that the gradients it applies are all-reduced first.

    Args:
        optimizer: any keras.optimizers.Optimizer, before it has taken a step.
        compression: Compression.none (None), .fp16 or .bf16 for the gradients on the wire.
        op: Average (default) or Sum over ranks.
        backward_passes_per_step: passes accumulated (Keras' gradient_accumulation_steps)
            before the variables are updated.
        average_aggregated_gradients: divide the accumulated gradients by the passes (True)
            or sum them (False, as Horovod).
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
        sparse_as_dense: accepted for Horovod compatibility; Keras 3 hands dense gradients.
    """
    wrapped = distributed_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped._hvdplus_configure(op, backward_passes_per_step, average_aggregated_gradients,
                               gradient_predivide_factor, compression)
    return wrapped
