"""What Horovod's Keras callbacks do in `model.fit`, with no Keras: give every rank one
rank's model at the start, average each epoch's logs, and follow a learning-rate schedule.

Keras 3 (`hvdplus.keras.callbacks`) and tf_keras, the Keras 2 that TensorFlow serves as
`tf.keras` under `TF_USE_LEGACY_KERAS=1` (`hvdplus.tensorflow.keras2.callbacks`), each put
these classes before their own `Callback` class, which calls the hooks (`on_train_begin`...)
and gives them `self.model` and `self.params`. The few steps that differ between the two
Kerases are methods that their callback classes define, named in each class below.
"""

import numpy as np

from . import collectives, runtime
from .process_sets import global_process_set, runtime_of

__all__ = ["BroadcastGlobalVariables", "MetricAverage", "LearningRateSchedule", "LearningRateWarmup"]


class BroadcastGlobalVariables:
    """Broadcasts the model's and the optimizer's variables once, at the start of training,
    or at the end of the first step for a model Keras builds only then.

    A Keras defines `_broadcast_variables(variables, prefix)` (root_rank's values to every
    rank of process_set) and `_optimizer_variables(optimizer)` (its variables, built for the
    model's trainable variables first if it has none yet)."""

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
        self._broadcast_variables(self._shared(self.model.variables), "model")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            self._broadcast_variables(self._shared(self._optimizer_variables(optimizer)), "optimizer")
        self._done = True

    def _shared(self, variables):
        return [variable for variable in variables if id(variable) not in self._local]


class MetricAverage:
    """Replaces each epoch's numeric logs by their average over the ranks of `process_set`:
    weighted by each rank's samples in the epoch where `local_samples` or `load_balancer`
    tells them (Keras' epoch logs are means over the rank's own samples, so the weighted
    average is the mean over every rank's samples), else plain."""

    def __init__(self, device="", process_set=global_process_set, local_samples=None, load_balancer=None):
        super().__init__()
        self.process_set = process_set
        self.local_samples = local_samples
        self.load_balancer = load_balancer
        self._epoch_samples = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_samples = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.load_balancer is not None:
            self._epoch_samples += self.load_balancer.local_batch_size()

    def _weight(self):
        """This rank's samples in the epoch (None: the plain average)."""
        if self.local_samples is not None:
            return self.local_samples
        return self._epoch_samples if self.load_balancer is not None else None

    def on_epoch_end(self, epoch, logs=None):
        if runtime_of(self.process_set, "MetricAverageCallback").topology.size == 1 or not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = collectives.allreduce(values, name=f"metric_average.{epoch}.{','.join(keys)}",
                                         process_set=self.process_set, weight=self._weight())
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


class _LearningRate:
    """Sets the learning rate to `initial_lr * multiplier_at(epoch)`, the epoch fractional
    within a batch loop unless `staircase`.

    A Keras defines `_learning_rate()` (the optimizer's, a float) and
    `_set_learning_rate(value)`."""

    def __init__(self, initial_lr, start_epoch, end_epoch, staircase, momentum_correction, steps_per_epoch,
                 verbose):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
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
        self._set_learning_rate(lr)
        if self.verbose and runtime.rank() == 0:
            print(f"\nEpoch {epoch:.3f}: {type(self).__name__} sets learning rate to {lr:.6g}")

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:  # Keras 3's key, and Horovod's
            logs["learning_rate"] = logs["lr"] = self._learning_rate()


class LearningRateWarmup(_LearningRate):
    """Ramps the learning rate from `initial_lr / size()` up to `initial_lr` over
    `warmup_epochs`, counting the epoch as Horovod does (the current batch included)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, 0, warmup_epochs, False, momentum_correction, steps_per_epoch, verbose)
        self.warmup_epochs = warmup_epochs

    def multiplier_at(self, epoch):
        size = runtime.size()
        epoch += 1.0 / self._steps()
        return (1.0 + epoch * (size - 1) / self.warmup_epochs) / size

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self._set_learning_rate(self.initial_lr)
            if self.verbose and runtime.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished warming up to learning rate {self.initial_lr:.6g}")
        super().on_epoch_end(epoch, logs)


class LearningRateSchedule(_LearningRate):
    """`initial_lr * multiplier` (a number, or a function of the epoch) for epochs in
    [start_epoch, end_epoch)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, start_epoch, end_epoch, staircase, momentum_correction, steps_per_epoch,
                         verbose)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def multiplier_at(self, epoch):
        return self.multiplier(epoch)
