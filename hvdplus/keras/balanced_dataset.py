"""`hvdplus.keras.BalancedPyDataset`: a `keras.utils.PyDataset` whose batches on each rank are
that rank's share of a global batch, sized by a LoadBalancer, for Keras 3 `model.fit` on the
tensorflow, jax and torch backends (with `hvdplus.keras.callbacks.LoadBalanceCallback`).

    balancer = hvd.LoadBalancer(global_batch_size=256)
    dataset = hvd.BalancedPyDataset(x, y, balancer, seed=0)      # the same x, y on every rank
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset, epochs=10, callbacks=[hvd.callbacks.LoadBalanceCallback(dataset, optimizer)])

The k-th training batch of a fit (k counted over its epochs) is its global step. Each epoch
walks one permutation of the samples (from `seed + epoch`, the same on every rank) a global
batch at a time, and every rank takes its contiguous share of each global batch, as
`hvdplus.torch.BalancedSampler` does. Keras' input pipelines read batches ahead of training
(the TensorFlow backend's tf.data prefetch, the JAX backend's look-ahead on accelerators), so
the sizes of a step cannot be "the balancer's sizes when the batch is read": that moment
differs from rank to rank, and ranks that split one global batch with different sizes would
skip or repeat samples. Instead step k takes the sizes agreed at the end of step
k - 1 - prefetch (the balancer's sizes when the fit began, for the first steps): a rule every
rank applies alike, whatever its timing. A read that comes too early for its sizes waits for
them, so a pipeline reads at most `prefetch` batches ahead of the step being trained.
"""

import threading
from typing import Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np

from ..common.batch_shares import batch_share, epoch_order

__all__ = ["BalancedPyDataset"]

# How long a batch read ahead waits for its sizes before it gives up: far above any one step.
_WAIT_LIMIT_S = 600.0


class _StepSizes:
    """The sizes agreed for each global step of the fit under way, and which steps' batches
    were read: shared by the dataset (read by Keras' pipeline, maybe in a thread of its own)
    and the callback (on the training thread)."""

    def __init__(self, batches: int, prefetch: int):
        self.batches = batches
        self.prefetch = prefetch
        self.changed = threading.Condition()
        self.training = False
        self.first_epoch = 0
        self.agreed: Dict[int, Tuple[int, ...]] = {}
        self.trained = -1  # the last step whose sizes were agreed at its end
        self.reads = [0] * batches  # how often each batch index was read in this fit
        self.read_steps = set()
        self.order_errors: List[str] = []

    def start(self, first_epoch: int, sizes: Sequence[int]) -> None:
        with self.changed:
            self.training = True
            self.first_epoch = first_epoch
            self.agreed = {-1: tuple(sizes)}
            self.trained = -1
            self.reads = [0] * self.batches
            self.read_steps = set()
            self.order_errors = []

    def stop(self) -> None:
        """The fit ended: batches read ahead beyond it stop waiting."""
        with self.changed:
            self.training = False
            self.changed.notify_all()

    def sizes_for(self, step: int) -> Tuple[int, ...]:
        """The sizes of global step `step`: agreed at the end of step `step - 1 - prefetch`."""
        key = max(step - 1 - self.prefetch, -1)
        return self.agreed.get(key) or self.agreed[max(self.agreed)]

    def agree(self, step: int, sizes: Sequence[int]) -> None:
        """The sizes agreed (the same on every rank) at the end of global step `step`."""
        with self.changed:
            self.agreed[step] = tuple(sizes)
            self.trained = step
            # Later steps need the sizes of step - prefetch on: older ones are done with.
            for old in [key for key in self.agreed if key < step - self.prefetch - 1]:
                del self.agreed[old]
            self.read_steps = {read for read in self.read_steps if read >= step}
            self.changed.notify_all()

    def claim(self, index: int) -> Tuple[int, int, Optional[Tuple[int, ...]]]:
        """A read of batch `index`: its epoch, its global step (-1 outside a fit) and sizes
        (None outside a fit: the balancer's current ones).
        During a fit the k-th read of an index is that index's batch of the fit's k-th epoch,
        which does not depend on when it comes."""
        with self.changed:
            if not self.training:
                return self.first_epoch, -1, None
            round_ = self.reads[index]
            self.reads[index] += 1
            step = round_ * self.batches + index
            needed = step - 1 - self.prefetch
            if needed > self.trained:
                self._wait_for(step, needed)
            self.read_steps.add(step)
            return self.first_epoch + round_, step, self.sizes_for(step)

    def _wait_for(self, step: int, needed: int) -> None:
        unread = [earlier for earlier in range(self.trained + 1, needed + 1) if earlier not in self.read_steps]
        if unread:
            # The steps before this one are trained on batches not read yet: Keras reads them
            # in another order (model.fit's shuffle=True). This read cannot wait for their
            # sizes; the callback raises on every rank at the end of the step.
            self.order_errors.append(f"batch {_index_of(step, self.batches)} of an epoch was read before batch "
                                     f"{_index_of(unread[0], self.batches)}")
            return
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError(
                f"BalancedPyDataset: the batch of global step {step} was read while step {self.trained + 1} "
                f"trained: the input pipeline reads {step - self.trained - 1} batches ahead, more than "
                f"prefetch={self.prefetch}; give BalancedPyDataset(prefetch={step - self.trained - 1}) on every rank")
        if not self.changed.wait_for(lambda: self.trained >= needed or not self.training, _WAIT_LIMIT_S):
            raise RuntimeError(f"BalancedPyDataset: the batch of global step {step} waited {_WAIT_LIMIT_S:g} s for "
                               f"the sizes agreed at the end of step {needed}, which did not come")


def _index_of(step: int, batches: int) -> int:
    """The batch index within its epoch of global step `step`."""
    return step % batches


class BalancedPyDataset(keras.utils.PyDataset):
    """Each rank's share of every global batch of an epoch, sized by a LoadBalancer, for
    `model.fit` with `hvdplus.keras.callbacks.LoadBalanceCallback(dataset, optimizer)`.

    Every rank holds the same `x` and `y` (or arrays of the same length and order) and
    walks the same permutation of them, one global batch of `global_batch_size` samples
    at a time; it yields its contiguous share of each (rank 0 the first `sizes[0]`, rank 1
    the next, ...), so over an epoch the ranks train every sample exactly once. The last
    global batch, when fewer samples are left, is split in proportion to the sizes, or left
    out with `drop_last`. Every rank yields the same number of batches.

    In `model.fit`, global step k takes the sizes the callback agreed at the end of step
    k - 1 - `prefetch` (see the module's docstring): a rebalance shows `prefetch` + 1 steps
    later. Outside a fit (`evaluate`, `predict`, reading it by hand) batch i is the share of
    global batch i of the last fit's first epoch, with the balancer's current sizes.

    Args:
        x: the inputs: an array (or anything that takes an array of indices) of N samples.
        y: the targets, N of them, or None.
        load_balancer: the `LoadBalancer` shared by the ranks that split the batches (its
            process set's rank is this rank's position).
        shuffle: visit the samples in an order drawn from `seed + epoch`; otherwise in index
            order. Give `model.fit(..., shuffle=False)`: Keras' own shuffle of the batches
            differs from rank to rank, and the callback raises on every rank when it sees it.
        seed: the same on every rank.
        prefetch: how many batches Keras' pipeline may read ahead of the step being trained
            (1 covers the JAX backend's look-ahead on accelerators; the TensorFlow backend's
            prefetch waits for the sizes beyond it); the same on every rank.
        drop_last: leave out an epoch's last global batch when it is not full.
    """

    def __init__(self, x, y, load_balancer, shuffle: bool = True, seed: int = 0, prefetch: int = 1,
                 drop_last: bool = False):
        super().__init__()
        self.x, self.y = x, y
        self.samples = len(x)
        if y is not None and len(y) != self.samples:
            raise ValueError(f"BalancedPyDataset: x has {self.samples} samples and y {len(y)}; give as many of each")
        if prefetch < 0:
            raise ValueError(f"BalancedPyDataset: prefetch must be 0 or more, got {prefetch}")
        self.load_balancer = load_balancer
        self.shuffle, self.seed, self.prefetch, self.drop_last = bool(shuffle), int(seed), int(prefetch), drop_last
        self._check_every_share_has_a_sample()
        self._orders: Dict[int, np.ndarray] = {}
        self.steps = _StepSizes(len(self), self.prefetch)

    def _check_every_share_has_a_sample(self) -> None:
        # An empty local batch gives Keras a mean loss over no samples: NaN gradients.
        balancer = self.load_balancer
        ranks = balancer.process_set.size()
        rest = self.samples % balancer.global_batch_size
        if balancer.min_batch_size < 1 or (rest and not self.drop_last and rest < ranks) or len(self) == 0:
            raise ValueError(
                f"BalancedPyDataset: {self.samples} samples in global batches of {balancer.global_batch_size} over "
                f"{ranks} ranks (min_batch_size={balancer.min_batch_size}) leave some rank a batch with no samples; "
                "give a LoadBalancer with min_batch_size >= 1 and a last global batch of at least one sample per "
                "rank (or drop_last=True)")

    def __len__(self) -> int:
        """The global batches of an epoch."""
        full, rest = divmod(self.samples, self.load_balancer.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def share(self, epoch: int, index: int, sizes: Sequence[int]) -> np.ndarray:
        """This rank's sample indices in batch `index` of epoch `epoch`, split by `sizes`.

        Args:
            epoch: the epoch, whose permutation the batch is taken from.
            index: the global batch's position in the epoch.
            sizes: every rank's local size for a full global batch, in rank order.
        """
        order = self._orders.get(epoch)
        if order is None:
            order = epoch_order(self.samples, self.shuffle, self.seed, epoch)
            self._orders = {epoch: order}  # Keras reads an epoch's batches in turn: one order kept
        start, stop = batch_share(sizes, index * self.load_balancer.global_batch_size, self.samples,
                                  self.load_balancer.process_set.rank())
        return order[start:stop]

    def local_samples(self, step: int) -> int:
        """The samples of this rank's batch at global step `step` of the fit under way."""
        index = _index_of(step, len(self))
        start, stop = batch_share(self.steps.sizes_for(step), index * self.load_balancer.global_batch_size,
                                  self.samples, self.load_balancer.process_set.rank())
        return stop - start

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"BalancedPyDataset: batch {index} of {len(self)}")
        epoch, _, sizes = self.steps.claim(index)
        ids = self.share(epoch, index, sizes or self.load_balancer.sizes())
        return (self.x[ids],) if self.y is None else (self.x[ids], self.y[ids])

    def settings(self) -> List[float]:
        """What every rank must agree on, for the callback to compare."""
        return [self.samples, self.load_balancer.global_batch_size, self.seed, self.shuffle, self.prefetch,
                self.drop_last]

    def order_error(self) -> Optional[str]:
        """Why the batches were read out of order in this fit, or None."""
        errors = self.steps.order_errors
        return errors[0] if errors else None
