"""Keras callbacks with Horovod's names and behaviour, for `model.fit` on every rank."""

import re

import keras
import numpy as np

from ..engine import collectives, runtime
from ..engine.process_sets import global_process_set, set_runtime

__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
    "LearningRateScheduleCallback", "BestModelCheckpoint",
]


def broadcast_variables(variables, root_rank=0, prefix="variable", process_set=None):
    """Overwrite the Keras variables of every rank (of `process_set`) with `root_rank`'s values.

    Variables are named by their path, so ranks whose models differ (another layer, another
    shape) get a TensorMismatchError naming the variable on every rank, never a hang."""
    set_runtime(process_set, "broadcast_variables()")  # a rank outside the set: its ValueError first
    handles = []
    for index, variable in enumerate(variables):
        name = f"{prefix}.{index}.{_stable_path(variable)}"
        value = np.array(keras.ops.convert_to_numpy(variable), order="C")  # keeps 0-d shapes
        handles.append((variable, collectives.broadcast_async(value, root_rank, name, process_set)))
    for variable, handle in handles:
        variable.assign(handle.wait())


def _stable_path(variable) -> str:
    """The variable's path without Keras' per-process counters ('sequential_3/dense_7/kernel'
    becomes 'sequential/dense/kernel'): ranks that built other models first still agree."""
    path = getattr(variable, "path", "") or getattr(variable, "name", "")
    return "/".join(re.sub(r"_\d+$", "", part) for part in path.split("/"))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank `root_rank`'s model and optimizer variables
    (the optimizer is built first if it has not created its variables yet), so that ranks
    that initialised differently train one model. A model that Keras builds only in its
    first step (no input shape given) gets them at the end of that step instead, as in
    Horovod. `local_variables` (as in Horovod) keep each rank's own values. With
    `process_set`, only that set's ranks take the values of `root_rank` (a job rank in the
    set); a rank outside it gets a ValueError. `device` is accepted for Horovod's signature;
    hvdplus broadcasts from host memory."""

    def __init__(self, root_rank=0, device="", local_variables=None, process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self._local = {id(variable) for variable in (local_variables or [])}
        self._done = False

    def on_train_begin(self, logs=None):
        self._done = False
        if self.model.built and self.model.variables:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self._done:
            self._broadcast()

    def _broadcast(self):
        broadcast_variables(self._shared(self.model.variables), self.root_rank, "model", self.process_set)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            broadcast_variables(self._shared(optimizer.variables), self.root_rank, "optimizer", self.process_set)
        self._done = True

    def _shared(self, variables):
        return [variable for variable in variables if id(variable) not in self._local]


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each epoch's logs by their average over ranks. Put it first in `callbacks`,
    so EarlyStopping, ReduceLROnPlateau and ModelCheckpoint decide the same on every rank.
    With `process_set`, the average is over that set's ranks (a rank outside it gets a
    ValueError). `device` is accepted for Horovod's signature; the logs are averaged on the
    host."""

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if set_runtime(self.process_set, "MetricAverageCallback").topology.size == 1 or not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = collectives.allreduce(values, name=f"metric_average.{epoch}.{','.join(keys)}",
                                         process_set=self.process_set)
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


def _set_learning_rate(model, value):
    model.optimizer.learning_rate.assign(value)


class _LearningRateCallback(keras.callbacks.Callback):
    """Sets the learning rate from `multiplier_at(epoch)` (epoch fractional within a batch loop).

    Only the learning rate, a variable: Horovod also scales an optimizer's momentum for the
    step after each change (`momentum_correction`), but Keras 3 compiles the momentum into the
    training step as a constant (tf.function, jax.jit), where a new value would not be seen."""

    def __init__(self, initial_lr, start_epoch, end_epoch, staircase, steps_per_epoch, verbose):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def multiplier_at(self, epoch):
        raise NotImplementedError

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _steps(self):
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError(f"{type(self).__name__} needs steps_per_epoch when model.fit cannot tell it")
        return steps

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self._active(epoch) and self.staircase:
            self._apply(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._active(self.current_epoch):
            return
        self._apply(self.current_epoch + batch / self._steps())

    def _apply(self, epoch):
        lr = self.initial_lr * self.multiplier_at(epoch)
        _set_learning_rate(self.model, lr)
        if self.verbose and runtime.rank() == 0:
            print(f"\nEpoch {epoch:.3f}: {type(self).__name__} sets learning rate to {lr:.6g}")

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:  # Keras 3's key, and Horovod's
            logs["learning_rate"] = logs["lr"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(_LearningRateCallback):
    """Ramp the learning rate from `initial_lr / size()` up to `initial_lr` over
    `warmup_epochs`, batch by batch, as Goyal et al. advise when lr is scaled by size():

        lr(epoch) = initial_lr / size * (1 + epoch * (size - 1) / warmup_epochs)

    where `epoch` counts completed epochs plus the fraction of the current one, the current
    batch included (as Horovod counts it, so the last batch of an epoch reaches a round
    number). Arguments in
    Horovod's order; `momentum_correction` is accepted, and the momentum left as it is (see
    _LearningRateCallback)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, 0, warmup_epochs, False, steps_per_epoch, verbose)
        self.warmup_epochs = warmup_epochs

    def multiplier_at(self, epoch):
        size = runtime.size()
        epoch += 1.0 / self._steps()
        return (1.0 + epoch * (size - 1) / self.warmup_epochs) / size

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            _set_learning_rate(self.model, self.initial_lr)
            if self.verbose and runtime.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished warming up to learning rate {self.initial_lr:.6g}")
        super().on_epoch_end(epoch, logs)


class LearningRateScheduleCallback(_LearningRateCallback):
    """lr = initial_lr * multiplier for epochs in [start_epoch, end_epoch); `multiplier` is a
    number or a function of the epoch. With staircase=False it changes every batch, the
    epoch counted fractionally. Arguments in Horovod's order; `momentum_correction` is
    accepted, and the momentum left as it is (see _LearningRateCallback)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, start_epoch, end_epoch, staircase, steps_per_epoch, verbose)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def multiplier_at(self, epoch):
        return self.multiplier(epoch)


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
