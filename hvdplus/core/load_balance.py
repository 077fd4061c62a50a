"""`hvd.LoadBalancer`: local batch sizes that follow each rank's measured speed, so ranks of
different speeds finish their steps together.

    balancer = hvd.LoadBalancer(global_batch_size=256)
    for step in range(steps):
        start = time.perf_counter()
        ...forward and backward on balancer.local_batch_size() samples...
        balancer.record(balancer.local_batch_size(), time.perf_counter() - start)
        ...average the gradients with weight=balancer.local_batch_size(), step the optimizer...
        balancer.rebalance()          # every rank, at the same step boundary

Each rank smooths its own compute time per sample; `rebalance()` gathers the ranks' speeds,
last compute times and settings (one all-gather of five numbers per rank), and every rank
computes the same sizes from them (hvdplus/common/batch_sizes.py). Where a timeline is being written, the
job's rank 0 adds each rank's compute seconds of its last step and its local batch size to it,
as two counter tracks.
"""

import logging
import math
import time
from typing import List, Optional, Sequence

import numpy as np

from ..common.batch_sizes import balanced_sizes, departures, moves_enough
from ..common.reduce_ops import Average, as_reduce_op
from .collectives import allgather
from .process_sets import global_process_set, ranks_in
from .runtime import current

__all__ = ["LoadBalancer", "check_weighted_op", "sample_count"]

_log = logging.getLogger("hvdplus.load_balance")
# A rank with no share of a full batch weighs this little when a short batch is split: nothing.
_NO_SHARE = 1e-9


def sample_count(local_samples, load_balancer: Optional["LoadBalancer"]):
    """The count that weighs a rank's gradients now: `local_samples` where given, else the
    balancer's local batch size, else None (the plain average)."""
    if local_samples is not None:
        return local_samples
    return None if load_balancer is None else load_balancer.local_batch_size()


def check_weighted_op(op, what: str) -> None:
    """Weighting gradients by sample counts is an average: ValueError naming `what` for any
    other op."""
    if as_reduce_op(op) != Average:
        raise ValueError(f"{what}: weighting gradients by local sample counts needs op=Average, got "
                         f"op={as_reduce_op(op).label}")


class LoadBalancer:
    """Right-sizes each rank's local batch at step boundaries from its measured speed.

    Args:
        global_batch_size: the samples of one step over all ranks of the process set; the
            local sizes always sum to it.
        min_batch_size: the fewest samples a rank gets, however slow it is.
        smoothing: the weight of the newest measurement in the exponential average of the
            time per sample (1: only the last step counts; smaller: steadier, slower to adapt).
        hysteresis: sizes change only when the new ones move some rank by more than this
            fraction of its current size, so that noise does not move them every step.
        report_threshold: rank 0 logs the ranks whose speed departs from the median by more
            than this fraction (a warning on the "hvdplus.load_balance" logger).
        report_interval_s: the least time between two such log lines.
        process_set: the ranks that balance among themselves (the whole job by default).
        warmup_steps: the measurements left out after the start and each reset: a first step
            carries one-time costs (allocations, the first collectives, autotuning) many times
            a step's, which would hold the sizes back for many steps.
    """

    def __init__(self, global_batch_size: int, min_batch_size: int = 1, smoothing: float = 0.5,
                 hysteresis: float = 0.1, report_threshold: float = 0.2, report_interval_s: float = 60.0,
                 process_set=global_process_set, warmup_steps: int = 1):
        if not 0 < smoothing <= 1:
            raise ValueError(f"LoadBalancer: smoothing must be in (0, 1], got {smoothing}")
        if warmup_steps < 0:
            raise ValueError(f"LoadBalancer: warmup_steps must be 0 or more, got {warmup_steps}")
        if hysteresis < 0 or report_threshold < 0:
            raise ValueError(f"LoadBalancer: hysteresis ({hysteresis}) and report_threshold ({report_threshold}) "
                             "must be 0 or more")
        self.global_batch_size = global_batch_size
        self.min_batch_size = min_batch_size
        self.smoothing = float(smoothing)
        self.hysteresis = float(hysteresis)
        self.report_threshold = float(report_threshold)
        self.report_interval_s = float(report_interval_s)
        self.process_set = process_set
        self.warmup_steps = int(warmup_steps)
        self._last_report: Optional[float] = None
        self.reset()

    def reset(self) -> None:
        """Forget the measurements and split the global batch evenly over the process set's
        current ranks: when the hardware changed. An elastic resize does this by itself."""
        self._size = self.process_set.size()
        self._rank = self.process_set.rank()
        self._seconds_per_sample: Optional[float] = None
        self._last_compute_seconds = 0.0
        self._warmup_left = self.warmup_steps
        self._speeds: Optional[List[float]] = None
        self._sizes = balanced_sizes([1.0] * self._size, self.global_batch_size, self.min_batch_size)

    def record(self, samples: int, compute_seconds: float) -> None:
        """Add one step's measurement: `samples` processed in `compute_seconds` of compute
        (forward and backward; leave out time spent waiting in collectives or for data).

        Args:
            samples: the samples of this step on this rank (a step of none is ignored).
            compute_seconds: the seconds they took.
        """
        if samples < 0 or not math.isfinite(compute_seconds) or compute_seconds < 0:
            raise ValueError(f"LoadBalancer.record: needs samples >= 0 and finite compute_seconds >= 0, got "
                             f"{samples} samples in {compute_seconds} s")
        if samples == 0 or compute_seconds == 0:
            return
        self._last_compute_seconds = float(compute_seconds)
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        latest = compute_seconds / samples
        previous = self._seconds_per_sample
        self._seconds_per_sample = latest if previous is None else (
            previous + self.smoothing * (latest - previous))

    def _follow_resize(self) -> None:
        """Start afresh where the job re-formed since the sizes were made (hvdplus.elastic): the
        sizes are for another number of ranks, and the measurements for another rank order.
        Every rank sees the new size, so every rank resets, and the ranks stay agreed."""
        if (self.process_set.size(), self.process_set.rank()) != (self._size, self._rank):
            self.reset()

    def rebalance(self) -> List[int]:
        """Agree on new sizes (every rank of the process set calls it at the same step
        boundary) and return them, in rank order. Until every rank has recorded a step the
        sizes stay as they are."""
        self._follow_resize()
        own = 1.0 / self._seconds_per_sample if self._seconds_per_sample else 0.0
        mine = [own, self._last_compute_seconds, self.global_batch_size, self.min_batch_size, self.hysteresis]
        gathered = allgather(np.array(mine, dtype=np.float64), name="load_balance.speeds",
                             process_set=self.process_set).reshape(-1, len(mine))
        self._check_same_settings(gathered[:, 2:])
        speeds = [float(speed) for speed in gathered[:, 0]]
        if min(speeds) <= 0:
            return list(self._sizes)
        self._speeds = speeds
        proposed = balanced_sizes(speeds, self.global_batch_size, self.min_batch_size)
        if moves_enough(self._sizes, proposed, self.hysteresis):
            self._sizes = proposed
        self._report(speeds)
        self._add_to_timeline(gathered[:, 1])
        return list(self._sizes)

    def _check_same_settings(self, settings) -> None:
        # Every rank computes the sizes itself: ranks whose settings differ would each pick
        # sizes of their own, which sum to no global batch. Every rank sees the same gathered
        # values, so every rank raises.
        for column, name in enumerate(("global_batch_size", "min_batch_size", "hysteresis")):
            values = settings[:, column]
            if np.any(values != values[0]):
                ranks = ranks_in(self.process_set, "LoadBalancer.rebalance()")
                listed = ", ".join(f"rank {rank} has {value:g}" for rank, value in zip(ranks, values))
                raise ValueError(f"LoadBalancer.rebalance(): the ranks' balancers differ in {name}: {listed}; "
                                 "give every rank the same settings")

    def _add_to_timeline(self, compute_seconds) -> None:
        timeline = current("LoadBalancer.rebalance()").engine.timeline  # on the job's rank 0 only
        if timeline is None:
            return
        # Each series is named by the job's rank, which a process set's own order may not be.
        ranks = ranks_in(self.process_set, "LoadBalancer.rebalance()")
        timeline.counter("load_balance.compute_seconds",
                         {f"rank {rank}": float(seconds) for rank, seconds in zip(ranks, compute_seconds)})
        timeline.counter("load_balance.local_batch_size",
                         {f"rank {rank}": size for rank, size in zip(ranks, self._sizes)})

    def _report(self, speeds: Sequence[float]) -> None:
        if self._rank != 0:
            return
        now = time.monotonic()
        if self._last_report is not None and now - self._last_report < self.report_interval_s:
            return
        departing = departures(speeds, self.report_threshold)
        if departing:
            self._last_report = now
            listed = ", ".join(f"rank {rank} at {speed:.4g} samples/s ({ratio:.2f}x)"
                               for rank, speed, ratio in departing)
            _log.warning("load balance: ranks departing from the median speed %.4g samples/s by more than %d %%: "
                         "%s; local batch sizes now %s", float(np.median(speeds)), round(100 * self.report_threshold),
                         listed, self._sizes)

    def sizes(self) -> List[int]:
        """Every rank's current local batch size, in rank order (they sum to the global batch)."""
        self._follow_resize()
        return list(self._sizes)

    def local_batch_size(self) -> int:
        """This rank's current local batch size."""
        self._follow_resize()
        return self._sizes[self._rank]

    def speeds(self) -> Optional[List[float]]:
        """The ranks' smoothed speeds (samples per second) agreed at the last rebalance that had
        a measurement from every rank; None before it."""
        return None if self._speeds is None else list(self._speeds)

    def offset(self) -> int:
        """Where this rank's share starts in a global batch: the sizes of the ranks before it."""
        self._follow_resize()
        return sum(self._sizes[:self._rank])

    def slice(self, indices):
        """This rank's contiguous share of a global batch: `indices[offset:offset + size]`.
        A shorter batch (an epoch's last) is split in the same proportions, each share within
        one sample of its exact part.

        Args:
            indices: the global batch's sample indices (a sequence or array of at most
                global_batch_size entries), the same on every rank.
        """
        self._follow_resize()
        count = len(indices)
        if count > self.global_batch_size:
            raise ValueError(f"LoadBalancer.slice: got {count} indices for a global batch of "
                             f"{self.global_batch_size}")
        if count == 0:
            return indices[0:0]
        sizes = self._sizes if count == self.global_batch_size else balanced_sizes(
            [size or _NO_SHARE for size in self._sizes], count, 0)
        start = sum(sizes[:self._rank])
        return indices[start:start + sizes[self._rank]]
