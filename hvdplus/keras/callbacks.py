"""Keras callbacks with Horovod's names and behaviour, for `model.fit` on every rank."""

import keras

from ..core import fit_callbacks, runtime
from .functions import broadcast_variables
from .load_balance_callback import LoadBalanceCallback
from .model_averaging import DiLoCoCallback, LocalSGDCallback

__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
    "LearningRateScheduleCallback", "BestModelCheckpoint", "LoadBalanceCallback", "LocalSGDCallback",
    "DiLoCoCallback",
]


class BroadcastGlobalVariablesCallback(fit_callbacks.BroadcastGlobalVariables, keras.callbacks.Callback):
    """At the start of training, give every rank `root_rank`'s model and optimizer variables
    (the optimizer is built first if it has not created its variables yet), so that ranks
    that initialised differently train one model. A model that Keras builds only in its
    first step (no input shape given) gets them at the end of that step instead, as in
    Horovod. `local_variables` (as in Horovod) keep each rank's own values. With
    `process_set`, only that set's ranks take the values of `root_rank` (a job rank in the
    set); a rank outside it gets a ValueError. `device` is accepted for Horovod's signature;
    hvdplus broadcasts from host memory."""

    def _broadcast_variables(self, variables, prefix):
        broadcast_variables(variables, self.root_rank, prefix, self.process_set)

    def _optimizer_variables(self, optimizer):
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        return optimizer.variables


class MetricAverageCallback(fit_callbacks.MetricAverage, keras.callbacks.Callback):
    """Replace each epoch's logs by their average over ranks. Put it first in `callbacks`,
    so EarlyStopping, ReduceLROnPlateau and ModelCheckpoint decide the same on every rank.
    With `process_set`, the average is over that set's ranks (a rank outside it gets a
    ValueError). `device` is accepted for Horovod's signature; the logs are averaged on the
    host.

    Ranks with uneven data weigh their logs by their samples: `local_samples=n` (this rank's
    training samples in an epoch), or `load_balancer=` (the balancer's local batch size
    summed over the epoch's batches, read as each batch begins; with steps_per_execution=1).
    The validation logs are weighed alike, so shard validation data in the same proportions.
    Counts that are negative, or sum to zero, raise on every rank."""


class _OptimizerLearningRate:
    """The optimizer's learning rate, a variable. Only the learning rate: Horovod also
    scales an optimizer's momentum for the step after each change (`momentum_correction`),
    but Keras 3 compiles the momentum into the training step as a constant (tf.function,
    jax.jit), where a new value would not be seen."""

    def _learning_rate(self):
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def _set_learning_rate(self, value):
        self.model.optimizer.learning_rate.assign(value)


class LearningRateWarmupCallback(_OptimizerLearningRate, fit_callbacks.LearningRateWarmup,
                                 keras.callbacks.Callback):
    """Ramp the learning rate from `initial_lr / size()` up to `initial_lr` over
    `warmup_epochs`, batch by batch, as Goyal et al. advise when lr is scaled by size():

        lr(epoch) = initial_lr / size * (1 + epoch * (size - 1) / warmup_epochs)

    where `epoch` counts completed epochs plus the fraction of the current one, the current
    batch included (as Horovod counts it, so the last batch of an epoch reaches a round
    number). Arguments in
    Horovod's order; `momentum_correction` is accepted, and the momentum left as it is (see
    _OptimizerLearningRate)."""


class LearningRateScheduleCallback(_OptimizerLearningRate, fit_callbacks.LearningRateSchedule,
                                   keras.callbacks.Callback):
    """lr = initial_lr * multiplier for epochs in [start_epoch, end_epoch); `multiplier` is a
    number or a function of the epoch. With staircase=False it changes every batch, the
    epoch counted fractionally. Arguments in Horovod's order; `momentum_correction` is
    accepted, and the momentum left as it is (see _OptimizerLearningRate)."""


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint(save_best_only=True) that writes on rank 0 only; every rank still
    tracks the best value (identical on all ranks behind MetricAverageCallback)."""

    def __init__(self, filepath, monitor="val_loss", verbose=0, mode="auto", save_weights_only=False):
        super().__init__(filepath, monitor=monitor, verbose=verbose if runtime.rank() == 0 else 0,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode)

    def _save_model(self, epoch, batch, logs):
        if runtime.rank() == 0:
            return super()._save_model(epoch, batch, logs)
        # The other ranks only follow the best value, so rank 0's decisions are theirs too.
        self._should_save_model(epoch, batch, logs, self._get_file_path(epoch, batch, logs))
