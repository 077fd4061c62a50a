"""`hvdplus.keras.callbacks.LoadBalanceCallback`: drives a LoadBalancer from Keras 3
`model.fit` over a `BalancedPyDataset`: times each step's compute, agrees on new sizes at every
step's end, and weighs each step's gradients by the samples this rank trained in it."""

import time

import keras
import numpy as np

from ..core.collectives import allgather
from ..core.process_sets import ranks_in

__all__ = ["LoadBalanceCallback"]


class LoadBalanceCallback(keras.callbacks.Callback):
    """For `model.fit(dataset, shuffle=False, callbacks=[LoadBalanceCallback(dataset, optimizer)])`
    with a `BalancedPyDataset`, on every rank of the balancer's process set.

    - Before each step it gives the optimizer (a `DistributedOptimizer`) this rank's samples
      in the step's batch (`set_local_samples`), from the rule that sized that batch, so each
      step's update is the mean gradient over its global batch (the loss being a mean over
      each rank's samples), whichever batches Keras read ahead.
    - It times the step's compute: from the step's start to the moment its gradients reach the
      all-reduce (when the optimizer reads the count), not the wait for the other ranks; on
      one rank, without an all-reduce, to the step's end. It `record`s that and calls
      `rebalance()`, a collective, at every step's end on every rank, and hands the sizes to
      the dataset for the steps `prefetch` + 1 later.
    - It checks, in one all-gather of one number per rank per step, that each rank trained the
      step's own batch: Keras' `model.fit(shuffle=True)` reorders the batches, differently on
      each rank, and then every rank raises `RuntimeError`.

    Settings that differ between ranks (the dataset's length, seed, shuffle, prefetch or
    drop_last) raise `ValueError` on every rank when the fit begins, naming each rank's value.
    It needs `steps_per_execution=1` (one batch per Keras step) and the dataset's default
    `workers=1` without multiprocessing: a worker process holds a copy of the dataset that the
    agreed sizes do not reach.

    Args:
        dataset: the `BalancedPyDataset` given to `model.fit`.
        optimizer: the model's `DistributedOptimizer` (the model's optimizer when None).
    """

    def __init__(self, dataset, optimizer=None):
        super().__init__()
        self.dataset = dataset
        self.balancer = dataset.load_balancer
        self._optimizer = optimizer
        self._step = 0
        self._started = False
        self._samples = 0
        self._begin = 0.0

    @property
    def optimizer(self):
        return self._optimizer if self._optimizer is not None else self.model.optimizer

    def on_train_begin(self, logs=None):
        if not hasattr(self.optimizer, "set_local_samples"):
            raise TypeError(f"LoadBalanceCallback: the optimizer must be an hvdplus.keras DistributedOptimizer, got "
                            f"{type(self.optimizer).__name__}")
        if getattr(self.model, "steps_per_execution", 1) != 1:
            raise ValueError(f"LoadBalanceCallback: needs one batch per step, got steps_per_execution="
                             f"{self.model.steps_per_execution} in model.compile")
        if self.dataset.workers > 1 or self.dataset.use_multiprocessing:
            raise ValueError(f"LoadBalanceCallback: the dataset reads with workers={self.dataset.workers}, "
                             f"use_multiprocessing={self.dataset.use_multiprocessing}; it needs workers=1 without "
                             "multiprocessing, whose processes would not see the agreed sizes")
        self._check_same_settings()
        self._step = 0
        self._started = False

    def on_epoch_begin(self, epoch, logs=None):
        if not self._started:  # the fit's first epoch (initial_epoch) fixes the epochs' orders
            self.dataset.steps.start(epoch, self.balancer.sizes())
            self._started = True

    def on_train_batch_begin(self, batch, logs=None):
        self._samples = self.dataset.local_samples(self._step)
        optimizer = self.optimizer
        optimizer.set_local_samples(self._samples)
        optimizer._hvdplus_count_read_at = None
        self._begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        end = time.perf_counter()
        read = self.optimizer._hvdplus_count_read_at
        seconds = (read if read is not None and read >= self._begin else end) - self._begin
        self._check_order()
        self.balancer.record(self._samples, self.compute_seconds(self._step, self._samples, seconds))
        self.dataset.steps.agree(self._step, self.balancer.rebalance())
        self._step += 1

    def on_train_end(self, logs=None):
        self.dataset.steps.stop()

    def compute_seconds(self, step: int, samples: int, seconds: float) -> float:
        """The compute time recorded for global step `step` of the fit: `seconds` as measured.
        A subclass may measure otherwise (a device's own timer, say).

        Args:
            step: the fit's global step.
            samples: this rank's samples in it.
            seconds: the time from the step's start to its gradients' all-reduce.
        """
        return seconds

    def _check_order(self) -> None:
        steps = self.dataset.steps
        error = self.dataset.order_error()
        if error is None and self._step not in steps.read_steps:
            error = f"the batch of step {self._step} was not read before it trained"
        flags = allgather(np.array([0 if error is None else 1], dtype=np.int64), name="balanced_dataset.order",
                          process_set=self.balancer.process_set)
        if flags.any():
            steps.stop()
            ranks = ranks_in(self.balancer.process_set, "LoadBalanceCallback")
            listed = ", ".join(str(rank) for rank, flag in zip(ranks, flags) if flag)
            detail = f" (here: {error})" if error else ""
            raise RuntimeError(f"LoadBalanceCallback: rank(s) {listed} trained step {self._step} on another batch "
                               f"than the step's own{detail}: Keras read the batches out of order; give "
                               "model.fit(..., shuffle=False) (the dataset shuffles itself, alike on every rank)")

    def _check_same_settings(self) -> None:
        # Ranks whose datasets differ in these would split different global batches.
        mine = np.array(self.dataset.settings(), dtype=np.float64)
        gathered = allgather(mine, name="balanced_dataset.settings",
                             process_set=self.balancer.process_set).reshape(-1, len(mine))
        for column, name in enumerate(("samples", "global_batch_size", "seed", "shuffle", "prefetch", "drop_last")):
            values = gathered[:, column]
            if np.any(values != values[0]):
                ranks = ranks_in(self.balancer.process_set, "LoadBalanceCallback")
                listed = ", ".join(f"rank {rank} has {value:g}" for rank, value in zip(ranks, values))
                raise ValueError(f"LoadBalanceCallback: the ranks' BalancedPyDatasets differ in {name}: {listed}; "
                                 "give every rank the same data and settings")
