"""`hvd.DistributedOptimizer` of Horovod's TensorFlow API, for the three kinds of optimizer a
TensorFlow program may hold:

- a Keras 3 optimizer (`tf.keras.optimizers.*` on TensorFlow 2.16+): hvdplus.keras wraps it,
  its gradients all-reduced in `apply`, inside the training step's tf.function. `hvdplus.keras`
  sits above this package (it serves TensorFlow as one of Keras' backends), so the
  Horovod-compat layer above both (hvdplus.horovod_keras) hands the optimizer to it, and
  `import hvdplus.tensorflow` loads no Keras;
- a tf_keras (Keras 2) optimizer, `tf.keras.optimizers.*` under `TF_USE_LEGACY_KERAS=1`:
  hvdplus.tensorflow.keras2 wraps it, its gradients all-reduced where it computes them;
- a `tf.compat.v1.train.Optimizer`, Horovod's legacy path: `compute_gradients` all-reduces
  what the optimizer computes, and the rest is the optimizer's own.
"""

import sys

import tensorflow as tf

from ..common.reduce_ops import Average
from ..core.process_sets import global_process_set
from ..horovod_keras import wrap_keras_optimizer
from .compression import Compression
from .gradient_accumulation import GradientAccumulation, allreduced_or_accumulated
from .gradient_tape import DistributedGradientTape

__all__ = ["DistributedOptimizer"]


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose `compute_gradients` returns the wrapped optimizer's
    gradients all-reduced (or, with backward_passes_per_step above 1, accumulated towards an
    all-reduce every that many passes, which alone `apply_gradients` applies); `minimize`
    goes through both. Slots and variables are the wrapped optimizer's."""

    def __init__(self, optimizer, name, use_locking, tape_options, accumulation):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._tape_options = tape_options
        self._accumulation = accumulation

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients all-reduced over
        the ranks."""
        return allreduced_or_accumulated(self._optimizer.compute_gradients(*args, **kwargs), self._allreduced,
                                         self._accumulation)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        """The wrapped optimizer's update; when accumulating, on the passes that all-reduced,
        and `global_step` counts the others."""
        if self._accumulation is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name, **kwargs)
        grads_and_vars = list(grads_and_vars)
        return self._accumulation.apply(
            [grad for grad, _ in grads_and_vars],
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step, name, **kwargs),
            lambda: None if global_step is None else global_step.assign_add(1, read_value=False))

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)

    def _allreduced(self, grads, variables):
        # A tape made for each call reads the size of the job or process set as it is then.
        return DistributedGradientTape(tf.GradientTape(), **self._tape_options)._allreduced(grads, variables)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, local_samples=None,
                         load_balancer=None):
    """Wrap a TensorFlow optimizer so that the gradients it applies are all-reduced, in
    Horovod's argument order.

    Args:
        optimizer: a tf.keras optimizer (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1), or
            a tf.compat.v1.train.Optimizer.
        name: the v1 wrapper's name (Distributed<class> by default); Keras' keep theirs.
        use_locking: the v1 wrapper's; Keras optimizers have none.
        device_dense: accepted for Horovod's signature; hvdplus reduces on the host.
        device_sparse: likewise.
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        sparse_as_dense: densify IndexedSlices gradients instead of gathering them.
        backward_passes_per_step: passes whose gradients add up before an update.
        op: Average (default) or Sum over ranks.
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
        average_aggregated_gradients: divide the accumulated gradients by the passes (True)
            or apply their sum (False, as Horovod).
        num_groups: accepted for Horovod's signature; a step's gradients travel as one group.
        groups: likewise.
        process_set: the ranks whose gradients are averaged; the whole job by default. A rank
            outside the set applies its own gradients.
        local_samples: this rank's samples per step, which weigh its gradients in the
            average (op Average only); Keras 3 optimizers only (hvdplus.keras'
            DistributedOptimizer says more).
        load_balancer: an hvdplus LoadBalancer whose local batch size, read as each step
            runs, is that count; Keras 3 optimizers only.
    """
    weighted = local_samples is not None or load_balancer is not None
    if weighted and (isinstance(optimizer, tf.compat.v1.train.Optimizer) or _is_tf_keras_optimizer(optimizer)):
        raise ValueError(f"hvdplus.tensorflow.DistributedOptimizer: local_samples= and load_balancer= weigh the "
                         f"gradients of Keras 3 optimizers, not of {type(optimizer).__name__}; compute the "
                         "gradients with hvd.DistributedGradientTape(tape, local_samples=...) instead")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        tape_options = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                            gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)
        DistributedGradientTape(tf.GradientTape(), **tape_options)  # a bad op or process set raises now
        wrapped = _DistributedV1Optimizer(optimizer, name, use_locking, tape_options, None)
        if backward_passes_per_step != 1:
            wrapped._accumulation = GradientAccumulation(backward_passes_per_step, average_aggregated_gradients,
                                                         wrapped._allreduced)
        return wrapped
    if _is_tf_keras_optimizer(optimizer):
        from .keras2.optimizer import DistributedOptimizer as tf_keras_optimizer

        return tf_keras_optimizer(
            optimizer, name, device_dense, device_sparse, compression, sparse_as_dense, gradient_predivide_factor,
            op, backward_passes_per_step, average_aggregated_gradients, num_groups, groups, process_set)
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"hvdplus.tensorflow.DistributedOptimizer wraps Keras optimizers (tf.keras.optimizers.*) and "
            f"tf.compat.v1.train.Optimizer, not {type(optimizer).__name__}; in a custom training loop, wrap the "
            "tape in hvd.DistributedGradientTape instead"
        )
    return wrap_keras_optimizer(
        optimizer, compression=compression, op=op, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        gradient_predivide_factor=gradient_predivide_factor, sparse_as_dense=sparse_as_dense,
        process_set=process_set, local_samples=local_samples, load_balancer=load_balancer)


def _is_tf_keras_optimizer(optimizer) -> bool:
    # A tf_keras optimizer has had tf_keras imported; without it, nothing is.
    tf_keras = sys.modules.get("tf_keras")
    return tf_keras is not None and isinstance(
        optimizer, (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer))
