"""Elastic training with tf_keras (Keras 2), `tf.keras` under `TF_USE_LEGACY_KERAS=1`:
`hvd.elastic.KerasState`, and the callbacks that keep it current while `model.fit` runs,
as in Horovod's `horovod.tensorflow.keras.elastic`.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state)]              # last

    @hvd.elastic.run
    def train(state):
        state.model.fit(dataset, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=callbacks)

The model's and the optimizer's variables (tf.Variables, legacy optimizers' included) roll
back as numpy copies and sync by broadcasting the values of the rank with the newest commit.
"""

import tf_keras

from ...elastic import HostsUpdatedInterrupt, ObjectHandler, ObjectState, RanksFailedError, State, fit_callbacks, run
from ..elastic import VariablesHandler
from .optimizer import build_optimizer

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run",
           "ObjectState", "State", "HostsUpdatedInterrupt", "RanksFailedError"]

_OPTIMIZERS = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)


def _handler_for(value):
    if isinstance(value, tf_keras.Model):
        return VariablesHandler(value, lambda model: model.variables)
    if isinstance(value, _OPTIMIZERS):
        return VariablesHandler(value, lambda optimizer: optimizer.variables())
    return ObjectHandler(value)


class KerasState(State):
    """A built tf_keras model, its optimizer (the compiled one unless given) and any other
    values, as attributes (`state.model`, `state.optimizer`, `state.epoch`), that roll back
    together. An optimizer that has no slots yet creates them for the model's trainable
    variables now, so that there is something to save and sync."""

    def __init__(self, model, optimizer=None, **values):
        super().__init__(handler_for=_handler_for)
        if not model.built:
            raise ValueError("KerasState needs a built model: give it an input shape, call it once, or fit it a step")
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._track("model", model)
        if optimizer is not None:
            build_optimizer(optimizer, model.trainable_variables)
            self._track("optimizer", optimizer)
        for name, value in values.items():
            self._track(name, value)

    def reset(self) -> None:
        """Trace the training step again: the gradient all-reduce reads the job's size when
        it is traced."""
        self.model.train_function = None


class CommitStateCallback(fit_callbacks.CommitState, tf_keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of every epoch. Put
    it after the callbacks that update the state, so that the commit holds their work."""


class UpdateBatchStateCallback(fit_callbacks.UpdateBatchState, tf_keras.callbacks.Callback):
    """Keep `state.batch` at the number of batches of the current epoch that are done, and
    set it back to 0 at the end of the epoch."""


class UpdateEpochStateCallback(fit_callbacks.UpdateEpochState, tf_keras.callbacks.Callback):
    """Count `state.epoch` up by one at the end of every epoch."""
