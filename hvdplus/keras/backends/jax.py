"""Keras' JAX trainer computes and applies gradients in one `jax.jit`-compiled step, where they
are tracers that only a host callback could hand to MPI. A host callback costs XLA's CPU
runtime about 0.3 ms a step plus a slow copy each way (2.7 ms for the benchmark MLP's 2 MB of
gradients, more than its all-reduce), so for a model that trains with Keras' own `train_step`
the step is compiled in two halves instead: the gradients, then the update. Between them, the
gradients are concrete arrays whose numpy views (no copy, on the CPU) the engine all-reduces
as one group. `prepare_training` makes Keras build that split step for every model whose
optimizer is hvdplus' DistributedOptimizer.

Tracers still cross in a host callback: in a custom `train_step`, a custom loop under `jit`, or
a model under `keras.distribution`. They are packed into one array by the compiled step,
since every array crossing a callback costs a conversion each way. On the host the packed
array is reduced as a group of views of its members, so that ranks still compare every
member's shape (two models whose gradients merely add up to the same length must not be
summed). `io_callback`, because JAX may drop or repeat a `pure_callback`, and a collective
must run exactly once per step on every rank; `ordered` keeps it in program order with any
other callback."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import io_callback

from ...common.packed_members import members_of
from ...common.scaling import Reduction
from .step_weight import reduce_on_host_async


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None,
                      weight=None):
    reduction = Reduction(op, prescale_factor, postscale_factor)
    if not traced(tensors):
        # Concrete arrays (the split step's, or an eager apply_gradients): reduced where they lie.
        return reduce_on_host_async([np.asarray(t) for t in tensors], name, reduction, process_set, weight).wait()
    packed_dtype = jnp.result_type(*tensors)
    packed = jnp.concatenate([jnp.ravel(t).astype(packed_dtype) for t in tensors])
    shapes = [tuple(t.shape) for t in tensors]

    def reduce_on_host(array):
        reduced = np.empty(array.shape, array.dtype)
        # The count is read here, as each step runs, not when the step was traced.
        reduce_on_host_async(members_of(np.asarray(array), shapes), name, reduction, process_set, weight,
                             outputs=members_of(reduced, shapes)).wait()
        return reduced

    reduced = io_callback(reduce_on_host, jax.ShapeDtypeStruct(packed.shape, packed_dtype), packed, ordered=True)
    return [piece.astype(t.dtype) for piece, t in zip(members_of(reduced, shapes), tensors)]


def traced(tensors) -> bool:
    """Whether `tensors` are tracers of a step being compiled (their values come later)."""
    return any(isinstance(t, jax.core.Tracer) for t in tensors)


def prepare_training():
    """Have Keras' JAX trainer build split_train_step for hvdplus' optimizers (once a process)."""
    from keras.src.backend.jax.trainer import JAXTrainer

    keras_make = JAXTrainer.make_train_function
    if getattr(keras_make, "hvdplus_splits", False):
        return

    def make_train_function(self, force=False):
        if (self.train_function is None or force) and splits_its_step(self):
            self.train_function = self._make_function(split_train_step(self))
            return
        keras_make(self, force)

    make_train_function.hvdplus_splits = True
    JAXTrainer.make_train_function = make_train_function


def splits_its_step(model) -> bool:
    """Whether `model` trains with Keras' own compiled step and hvdplus' optimizer, the step
    that split_train_step reproduces (from the trainer's parts it names, which a Keras
    without them leaves to the host callback)."""
    from keras.src.backend.jax.trainer import JAXTrainer

    return (hasattr(model.optimizer, "_hvdplus_reduced") and model.jit_compile and not model.run_eagerly
            and type(model).train_step is JAXTrainer.train_step
            and all(hasattr(model, part) for part in _TRAINER_PARTS)
            and hasattr(model.optimizer, "_trainable_variables")
            and keras.distribution.distribution() is None and not keras.config.is_nnx_enabled())


# What split_train_step takes from Keras' JAX trainer besides its public API.
_TRAINER_PARTS = ("compute_loss_and_updates", "_update_metrics_variables", "_make_function")


def split_train_step(model):
    """Keras' JAX `train_step` for `model`, compiled as two halves with the gradients'
    all-reduce on the host between them. (logs, state) = step(state, data), as Keras' own."""
    optimizer = model.optimizer

    def gradients(state, data):
        trainable, non_trainable, optimizer_variables, metrics = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        value_and_grad = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (_, aux), grads = value_and_grad(trainable, non_trainable, metrics, x, y, sample_weight, training=True,
                                         optimizer_variables=optimizer_variables)
        return grads, aux

    def update(state, grads, aux, data):
        """The step's update, and its metrics; `grads` None: the metrics alone (the first step
        of staleness=1, which applies nothing)."""
        trainable, _, optimizer_variables, _ = state
        unscaled_loss, y_pred, non_trainable, metrics = aux
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if grads is not None:
            with optimizer._hvdplus_applying_reduced():
                trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
        logs, metrics = model._update_metrics_variables(metrics, unscaled_loss, x, y, y_pred, sample_weight)
        return logs, (trainable, non_trainable, optimizer_variables, metrics)

    gradients, update = jax.jit(gradients), jax.jit(update, donate_argnums=0)

    def step(state, data):
        grads, aux = gradients(state, data)
        if optimizer._hvdplus_reduces():
            if optimizer._hvdplus_delayed is not None:
                # The previous step's averaged gradients (None in the first step: metrics alone).
                grads = optimizer._hvdplus_exchange_delayed(grads)
            else:
                grads = optimizer._hvdplus_reduced(grads, optimizer._trainable_variables)
        return update(state, grads, aux, data)

    return step
