"""Horovod's Keras callbacks for tf_keras (Keras 2), `tf.keras` under `TF_USE_LEGACY_KERAS=1`:
what they do is hvdplus.core.fit_callbacks', as for Keras 3; they are tf_keras Callbacks,
which reach the model's variables as tf.Variables."""

import tensorflow as tf
import tf_keras

from ...core import fit_callbacks
from ..functions import broadcast_variables
from .mpi_ops import evaluated
from .optimizer import build_optimizer

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
           "LearningRateScheduleCallback"]


class BroadcastGlobalVariablesCallback(fit_callbacks.BroadcastGlobalVariables, tf_keras.callbacks.Callback):
    """At the start of training, give every rank `root_rank`'s model and optimizer variables
    (the optimizer creates its slots first if it has none yet), so that ranks that
    initialised differently train one model. A model that Keras builds only in its first
    step (no input shape given) gets them at the end of that step, as in Horovod.
    `local_variables` keep each rank's own values. With `process_set`, only that set's ranks
    take the values of `root_rank` (a job rank in the set); a rank outside it gets a
    ValueError. `device` is accepted for Horovod's signature."""

    def _broadcast_variables(self, variables, prefix):
        # A model built in a tf.compat.v1 graph gets the op, run in Keras' session.
        evaluated(broadcast_variables(variables, self.root_rank, self.process_set))

    def _optimizer_variables(self, optimizer):
        return build_optimizer(optimizer, self.model.trainable_variables)


class MetricAverageCallback(fit_callbacks.MetricAverage, tf_keras.callbacks.Callback):
    """Replace each epoch's logs by their average over ranks (of `process_set`). Put it first
    in `callbacks`, so that EarlyStopping, ReduceLROnPlateau and ModelCheckpoint decide the
    same on every rank. `device` is accepted for Horovod's signature."""


class _OptimizerLearningRate:
    """The optimizer's learning rate; with `momentum_correction`, as in Horovod, the momentum
    is scaled by new_lr / old_lr for the one step after each change of the learning rate.
    That takes a momentum the training step reads as a variable: the legacy optimizers'
    (`tf.keras.optimizers.legacy.SGD`, `RMSprop`); the others compile theirs in as a
    constant, and keep it."""

    _saved_momentum = None

    def _learning_rate(self):
        return float(tf_keras.backend.get_value(self.model.optimizer.learning_rate))

    def _set_learning_rate(self, value):
        tf_keras.backend.set_value(self.model.optimizer.learning_rate, value)

    def _apply(self, epoch):
        momentum = self._momentum_variable()
        before = self._learning_rate() if momentum is not None else 0.0
        super()._apply(epoch)
        if before:
            self._saved_momentum = float(tf_keras.backend.get_value(momentum))
            tf_keras.backend.set_value(momentum, self._saved_momentum * self._learning_rate() / before)

    def on_train_batch_end(self, batch, logs=None):
        if self._saved_momentum is not None:
            tf_keras.backend.set_value(self._momentum_variable(), self._saved_momentum)
            self._saved_momentum = None
        super().on_train_batch_end(batch, logs)

    def _momentum_variable(self):
        momentum = getattr(self.model.optimizer, "momentum", None) if self.momentum_correction else None
        return momentum if isinstance(momentum, tf.Variable) else None


class LearningRateWarmupCallback(_OptimizerLearningRate, fit_callbacks.LearningRateWarmup,
                                 tf_keras.callbacks.Callback):
    """Ramp the learning rate from `initial_lr / size()` up to `initial_lr` over
    `warmup_epochs`, batch by batch (Goyal et al.), as Horovod's does:
    `initial_lr / size * (1 + epoch * (size - 1) / warmup_epochs)`, `epoch` fractional and
    counting the current batch. Arguments in Horovod's order."""


class LearningRateScheduleCallback(_OptimizerLearningRate, fit_callbacks.LearningRateSchedule,
                                   tf_keras.callbacks.Callback):
    """lr = initial_lr * multiplier for epochs in [start_epoch, end_epoch); `multiplier` is a
    number or a function of the epoch. With staircase=False it changes every batch, the
    epoch counted fractionally. Arguments in Horovod's order."""
