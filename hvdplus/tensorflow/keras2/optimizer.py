"""DistributedOptimizer for tf_keras (Keras 2) optimizers, `tf.keras.optimizers.legacy.*`
included: the gradients the optimizer computes are all-reduced, as in Horovod.

Keras 2's `model.fit` (like `optimizer.minimize`) has the optimizer compute the gradients:
from the step's tape, in `compute_gradients` (the optimizers of TensorFlow 2.11 and later) or
`_compute_gradients` (the legacy ones); in a tf.compat.v1 graph, from the graph, in the legacy
optimizers' `get_gradients`. The wrapped optimizer all-reduces what these return as a
hvdplus.tensorflow DistributedGradientTape reduces its gradients: in one host op inside the
training step (IndexedSlices gathered, compression, process sets and local variables as the
tape has them). As in Horovod, `apply_gradients` applies what it is given: a custom loop
all-reduces with DistributedGradientTape.

With `backward_passes_per_step=N` the passes' gradients add up on each rank and are
all-reduced on every N-th pass, which alone `apply_gradients` applies
(hvdplus.tensorflow.gradient_accumulation).

The wrapped optimizer is an instance of a subclass of the user's optimizer class that keeps
its name and configuration, so a saved model holds the plain optimizer and
`hvd.load_model` wraps it again.
"""

import tensorflow as tf
import tf_keras

from ...common.local_layers import local_layer_variables
from ...common.mixed_classes import mixed_class
from ...common.reduce_ops import Average, Sum, as_reduce_op
from ...core.process_sets import global_process_set
from ..compression import Compression
from ..gradient_accumulation import GradientAccumulation, allreduced_or_accumulated
from ..gradient_tape import DistributedGradientTape

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "distributed_class", "optimizer_classes",
           "build_optimizer"]


class _DistributedOptimizer:
    """Mixed in before a tf_keras optimizer class; the class defaults are DistributedGradientTape's."""

    _hvdplus_tape_options = {}
    _hvdplus_local_variables = ()
    _hvdplus_accumulation = None  # a GradientAccumulation, with backward_passes_per_step above 1

    def compute_gradients(self, loss, var_list, tape=None):
        return self._hvdplus_reduced(super().compute_gradients(loss, var_list, tape))

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if not hasattr(super(), "_compute_gradients"):
            # The legacy optimizers' name for it, which programs written for them call on the others too.
            return self.compute_gradients(loss, var_list, tape)
        return self._hvdplus_reduced(super()._compute_gradients(loss, var_list, grad_loss, tape))

    def get_gradients(self, loss, params):
        params = tf.nest.flatten(params)
        return [grad for grad, _ in self._hvdplus_reduced(zip(super().get_gradients(loss, params), params))]

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if self._hvdplus_accumulation is None:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        grads_and_vars = list(grads_and_vars)
        with tf.init_scope():  # the slots, before the update that uses them goes into a tf.cond
            build_optimizer(self, [variable for _, variable in grads_and_vars])
        return self._hvdplus_accumulation.apply(
            [grad for grad, _ in grads_and_vars],
            lambda: super(_DistributedOptimizer, self).apply_gradients(grads_and_vars, *args, **kwargs),
            lambda: self.iterations.assign_add(1, read_value=False))

    def register_local_var(self, var):
        """Keep `var`'s gradient on this rank, not all-reduced (divided by the number of ranks
        unless scale_local_gradients=False), as Horovod's does."""
        self._hvdplus_local_variables = (*self._hvdplus_local_variables, var)

    def _hvdplus_reduced(self, grads_and_vars):
        return allreduced_or_accumulated(grads_and_vars, self._hvdplus_allreduced, self._hvdplus_accumulation)

    def _hvdplus_allreduced(self, grads, variables):
        # A tape made for each step reads the size of the job or process set as it is then.
        tape = DistributedGradientTape(tf.GradientTape(), **self._hvdplus_tape_options)
        for variable in self._hvdplus_local_variables:
            tape.register_local_source(variable)
        return tape._allreduced(grads, variables)


def optimizer_classes(legacy=False):
    """tf_keras' optimizer classes: those of `tf.keras.optimizers`, or of `.legacy`."""
    module = tf_keras.optimizers.legacy if legacy else tf_keras.optimizers
    base = module.Optimizer
    return [cls for cls in vars(module).values() if isinstance(cls, type) and issubclass(cls, base) and cls is not base]


def distributed_class(optimizer_class):
    """The hvdplus subclass of a tf_keras optimizer class (one per class, kept)."""
    return mixed_class(_DistributedOptimizer, optimizer_class)


def build_optimizer(optimizer, variables):
    """Create `optimizer`'s variables (iterations, slots) for `variables` if it has not yet;
    returns its variables."""
    if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(variables)
    elif not getattr(optimizer, "_built", False):
        optimizer.build(variables)
    return list(optimizer.variables())


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wrap a tf_keras optimizer so that the gradients it computes are all-reduced; arguments
    in the order of Horovod's `horovod.tensorflow.keras.DistributedOptimizer`.

    Args:
        optimizer: a `tf.keras.optimizers.*` or `tf.keras.optimizers.legacy.*` optimizer,
            before it has taken a step.
        name: accepted for Horovod's signature.
        device_dense: likewise; hvdplus reduces on the host.
        device_sparse: likewise.
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        sparse_as_dense: densify IndexedSlices gradients instead of gathering them.
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
        op: Average (default) or Sum over ranks.
        backward_passes_per_step: passes whose gradients add up on each rank before they are
            all-reduced and applied, together; the optimizer's `iterations` counts every pass.
        average_aggregated_gradients: divide those sums by backward_passes_per_step (True) or
            apply them whole (False, as Horovod).
        num_groups: accepted for Horovod's signature; one step's gradients travel as one group.
        groups: likewise.
        process_set: the ranks whose gradients are averaged; the whole job by default. A rank
            outside the set applies its own gradients.
        scale_local_gradients: divide the gradients of variables registered as local
            (`register_local_var`, PartialDistributedOptimizer) by the set's size.
    """
    if not isinstance(optimizer, (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)):
        raise TypeError(f"DistributedOptimizer under TF_USE_LEGACY_KERAS wraps tf.keras (tf_keras) optimizers, "
                        f"not {type(optimizer).__module__}.{type(optimizer).__name__}")
    if as_reduce_op(op) not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    wrapped = distributed_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped._hvdplus_tape_options = dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
    if backward_passes_per_step != 1:
        # Keras' session in a v1 graph initializes the variables Keras made.
        wrapped._hvdplus_accumulation = GradientAccumulation(
            backward_passes_per_step, average_aggregated_gradients, wrapped._hvdplus_allreduced,
            make_variable=lambda value, name: tf_keras.backend.variable(value, value.dtype, name))
    return wrapped


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                                process_set=global_process_set, local_layers=None, scale_local_gradients=True):
    """A DistributedOptimizer that keeps the gradients of `local_layers`' trainable variables
    on each rank (divided by the number of ranks with `scale_local_gradients`), as Horovod's
    does, in Horovod's argument order."""
    local = local_layer_variables(local_layers, tf_keras.layers.Layer, "tf.keras.layers.Layer")
    wrapped = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                   gradient_predivide_factor, op, backward_passes_per_step,
                                   average_aggregated_gradients, 0, groups, process_set, scale_local_gradients)
    for variable in local:
        wrapped.register_local_var(variable)
    return wrapped
