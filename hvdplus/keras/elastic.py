"""Elastic training with Keras 3 on every backend: `hvd.elastic.KerasState`, and the
callbacks that keep it current while `model.fit` runs.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]   # last

    @hvd.elastic.run
    def train(state):
        model.fit(the epoch's batches from state.batch on, initial_epoch=state.epoch,
                  epochs=epochs, callbacks=callbacks)

The model's weights and the optimizer's variables roll back as numpy copies and sync by
broadcasting the values of the rank with the newest commit. Keras 3 runs an epoch for as
many steps as its data gives, so after a re-form the training function passes what is left of the epoch: `state.batch`
batches of it are done.
"""

import keras
import numpy as np

from ..elastic import HostsUpdatedInterrupt, ObjectHandler, ObjectState, RanksFailedError, State, fit_callbacks, run
from .functions import broadcast_variables

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run",
           "ObjectState", "State", "HostsUpdatedInterrupt", "RanksFailedError"]


class _VariablesHandler(ObjectHandler):
    """Keeps numpy copies of a value's Keras variables (`variables_of(value)`), restores
    them by assignment, and syncs them by broadcasting one rank's."""

    def __init__(self, value, variables_of):
        self._variables_of = variables_of
        self.save(value)

    def save(self, value):
        self.saved = [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in self._variables_of(value)]

    def restore(self, value):
        for variable, saved in zip(self._variables_of(value), self.saved):
            variable.assign(saved)
        return value

    def sync(self, value, name, root_rank=0):
        broadcast_variables(self._variables_of(value), root_rank=root_rank, prefix=name)
        return value


def _model_weights(model):
    # The JAX trainer keeps the values of a running fit outside the variables, and after a
    # failed step may have emptied them: its last state goes back in before they are read.
    if hasattr(model, "jax_state_sync"):
        model.jax_state_sync()
    return model.weights


def _optimizer_variables(optimizer):
    return optimizer.variables


def _handler_for(value):
    if isinstance(value, keras.Model):
        return _VariablesHandler(value, _model_weights)
    if isinstance(value, keras.optimizers.Optimizer):
        return _VariablesHandler(value, _optimizer_variables)
    return ObjectHandler(value)


class KerasState(State):
    """A built Keras model, its optimizer (the compiled one unless given) and any other
    values, as attributes (`state.model`, `state.optimizer`, `state.epoch`), that roll back
    together.

    An optimizer that has not created its variables yet builds them for the model's
    trainable variables now, so that there is something to save and sync."""

    def __init__(self, model, optimizer=None, **values):
        super().__init__(handler_for=_handler_for)
        if not model.built:
            raise ValueError("KerasState needs a built model: give it an Input, call it once, or model.build(shape)")
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._track("model", model)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            self._track("optimizer", optimizer)
        for name, value in values.items():
            self._track(name, value)

    def reset(self) -> None:
        """Trace the training step again: TensorFlow and JAX compile the gradient reduction's
        scale factors into it, and these follow the job's size. JAX keeps its traces by the
        function traced, which a new train_function shares, so they go too."""
        if hasattr(self.model, "train_function"):
            self.model.train_function = None
        if keras.backend.backend() == "jax":
            import jax

            jax.clear_caches()


class CommitStateCallback(fit_callbacks.CommitState, keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of every epoch.
    Put it after the callbacks that update the state, so that the commit holds their work.

    The count starts afresh at each `fit` and each epoch, alike on every rank: the ranks
    that joined at a re-form and those that were there before commit together."""


class UpdateBatchStateCallback(fit_callbacks.UpdateBatchState, keras.callbacks.Callback):
    """Keep `state.batch` at the number of batches of the current epoch that are done, and
    set it back to 0 at the end of the epoch.

    A `fit` that resumes an epoch after a re-form counts its batches from 0 again: they are
    counted on from the `state.batch` the epoch began with."""


class UpdateEpochStateCallback(fit_callbacks.UpdateEpochState, keras.callbacks.Callback):
    """Count `state.epoch` up by one at the end of every epoch, so that it names the next
    epoch to run, whether `fit` was given `initial_epoch=state.epoch` or counts from 0."""
