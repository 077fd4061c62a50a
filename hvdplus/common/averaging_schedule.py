"""When periodic model averaging averages: the step counting of local SGD and DiLoCo.

Steps count from 0, one per optimizer step. As in torch's `PeriodicModelAverager` and
`PostLocalSGDOptimizer`, the first `warmup_steps` steps are synchronous (their gradients are
averaged, so the ranks' parameters stay equal), and from step `warmup_steps` on the parameters
are averaged after steps warmup_steps, warmup_steps + period, warmup_steps + 2 * period, ... A
DiLoCo outer step follows every `period` inner steps: the same schedule with
`warmup_steps = period - 1` (after steps period - 1, 2 * period - 1, ...).

Every rank computes the same schedule from the same settings; `differences` turns the settings
and steps the ranks gathered into the message each of them raises when they are not alike.
"""

import numbers
from typing import Optional, Sequence

__all__ = ["AveragingSchedule", "differences"]


def _count(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{what} must be an integer of at least {least}, got {value!r}")
    return int(value)


class AveragingSchedule:
    """Which steps are synchronous and after which ones the parameters are averaged.

    Args:
        period: steps between two averagings (1 or more).
        warmup_steps: synchronous steps before the first local one (0 or more).
        what: the caller's name, for the errors.
        synchronous_warmup: whether the steps before `warmup_steps` average their gradients.
    """

    def __init__(self, period: int, warmup_steps: int = 0, what: str = "PeriodicModelAverager",
                 synchronous_warmup: bool = True):
        self.period = _count(period, f"{what}: period", 1)
        self.warmup_steps = _count(warmup_steps, f"{what}: warmup_steps", 0)
        # DiLoCo's first steps only put off its first average: they are local, not synchronous.
        self.synchronous_warmup = synchronous_warmup

    @classmethod
    def after_every(cls, period: int, what: str) -> "AveragingSchedule":
        """The schedule of an average after every `period` steps: after steps period - 1,
        2 * period - 1, ... (DiLoCo's outer steps)."""
        return cls(period, _count(period, f"{what}: period", 1) - 1, what, synchronous_warmup=False)

    def synchronous(self, step: int) -> bool:
        """Whether `step` averages its gradients (a warm-up step)."""
        return self.synchronous_warmup and step < self.warmup_steps

    def averages_after(self, step: int) -> bool:
        """Whether the parameters are averaged after `step`."""
        return step >= self.warmup_steps and (step - self.warmup_steps) % self.period == 0

    def agreed_after(self, steps_taken: int) -> bool:
        """Whether the ranks hold the same parameters once `steps_taken` steps are done: none
        yet, or the last one was synchronous or averaged after."""
        last = steps_taken - 1
        return steps_taken == 0 or self.synchronous(last) or self.averages_after(last)

    def next_average(self, step: int) -> int:
        """The first step from `step` on after which the parameters are averaged."""
        if step <= self.warmup_steps:
            return self.warmup_steps
        return self.warmup_steps + -(-(step - self.warmup_steps) // self.period) * self.period

    def between_averages(self, steps_taken: int, what: str) -> Optional[str]:
        """None where the ranks hold the same parameters once `steps_taken` steps are done,
        else why a state taken now is one rank's alone, for the error of `what`."""
        if self.agreed_after(steps_taken):
            return None
        return (f"{what}: step {steps_taken - 1} was a local step, so each rank holds parameters of its "
                f"own until the ranks average after step {self.next_average(steps_taken)}")


def differences(columns: Sequence[str], rows: Sequence[Sequence[int]], ranks: Sequence[int]) -> Optional[str]:
    """None where every rank's row is the same, else what differs, by column and rank:
    "step: rank 0 has 4, ranks 1, 2 have 6".

    Args:
        columns: the name of each column.
        rows: one row of numbers per rank, in the order of `ranks`.
        ranks: the job rank of each row.
    """
    parts = []
    for column, name in enumerate(columns):
        by_value = {}
        for rank, row in zip(ranks, rows):
            by_value.setdefault(int(row[column]), []).append(rank)
        if len(by_value) > 1:
            listed = ", ".join(f"rank {who[0]} has {value}" if len(who) == 1
                               else f"ranks {', '.join(map(str, who))} have {value}"
                               for value, who in by_value.items())
            parts.append(f"{name}: {listed}")
    return "; ".join(parts) or None
