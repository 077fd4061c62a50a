"""Autotuning (HOROVOD_AUTOTUNE=1): the engine's fusion threshold, cycle time and, across
nodes, all-reduce algorithm, chosen by measuring the job's own training.

Rank 0's engine scores each setting by the bytes it all-reduces per second: a training step
all-reduces the same gradients every time, so bytes per second rises and falls with steps per
second. A sample is `steps_per_sample` engine cycles that all-reduced something, timed from
the cycle before the first to the last, so it spans whole cycles whatever the setting. After
`warmup_samples` samples at the starting setting (the first steps are slow for reasons of
their own), the tuner searches one knob at a time, as a coordinate descent: every fusion
threshold with the starting cycle time, then every cycle time with the best threshold, then
(across nodes) every algorithm with the best of both; each candidate is measured
`samples_per_candidate` times and scored by its best sample, which discounts samples that
another process's burst slowed. It then keeps the best setting seen and stops measuring.

Horovod tunes the same knobs with Bayesian optimisation over a continuous range; a grid of
a few values per knob, measured in turn, finds settings as good on the jobs hvdplus has been
measured on (benchmarks/autotune.py compares the choice with the best of the full grid),
and says plainly what it tried.

Every setting the tuner moves to reaches all ranks as an Outcome.TUNE batch, which each
engine applies at the same point of the batch sequence, so all ranks change algorithm
between the same two collectives. Each sample and the choice go to the log file
(`HOROVOD_AUTOTUNE_LOG`) as CSV, and the choice to rank 0's standard error.
"""

import dataclasses
import sys
import time
from typing import Callable, List, Optional, Sequence

from .fusion import fused_nbytes
from .protocol import Batch, Collective, Outcome

__all__ = ["Setting", "Autotuner", "TuningDriver", "FUSION_MIB", "CYCLE_MS"]

MIB = 1024 * 1024
FUSION_MIB = (1, 4, 16, 32, 64, 128)
CYCLE_MS = (0.5, 1.0, 2.5, 5.0, 10.0)
_ALLREDUCE = Collective.ALLREDUCE


@dataclasses.dataclass(frozen=True)
class Setting:
    fusion_bytes: int
    cycle_ms: float
    algorithm: Optional[str] = None  # None: as configured (tuned across nodes only)

    def describe(self) -> str:
        algorithm = f", algorithm {self.algorithm}" if self.algorithm else ""
        return f"fusion threshold {self.fusion_bytes / MIB:g} MiB, cycle time {self.cycle_ms:g} ms{algorithm}"


class Autotuner:
    """Tunes from `start`; `record` after every cycle that all-reduced bytes, on rank 0."""

    def __init__(self, start: Setting, algorithms: Sequence[str] = (), warmup_samples: int = 3,
                 steps_per_sample: int = 10, samples_per_candidate: int = 2, log_path: Optional[str] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.current = start
        self.best: Optional[Setting] = None
        self.done = False
        self._best_score = 0.0
        self._phases = [("fusion_bytes", [mib * MIB for mib in FUSION_MIB]), ("cycle_ms", list(CYCLE_MS))]
        if algorithms:
            self._phases.append(("algorithm", list(algorithms)))
        self._queue: List[Setting] = []
        self._warmup_left = warmup_samples
        self._steps_per_sample = steps_per_sample
        self._samples_per_candidate = samples_per_candidate
        self._samples_of_current = 0
        self._clock = clock
        self._sample_start: Optional[float] = None
        self._sample_steps = 0
        self._sample_bytes = 0
        self._log = open(log_path, "w") if log_path else None
        self._write("sample,fusion_threshold_mib,cycle_time_ms,algorithm,bytes_per_second,phase")
        self._sample_index = 0

    def record(self, nbytes: int) -> Optional[Setting]:
        """Count one cycle that all-reduced `nbytes`; the setting to move to when a sample
        ends and the tuner moves on, else None."""
        if self.done or nbytes <= 0:
            return None
        now = self._clock()
        if self._sample_start is None:  # this cycle only opens the sample: it ran before it began
            self._sample_start, self._sample_steps, self._sample_bytes = now, 0, 0
            return None
        self._sample_steps += 1
        self._sample_bytes += nbytes
        if self._sample_steps < self._steps_per_sample:
            return None
        score = self._sample_bytes / max(now - self._sample_start, 1e-9)
        self._sample_start = None
        return self._finish_sample(score)

    def _finish_sample(self, score: float) -> Optional[Setting]:
        self._sample_index += 1
        if self._warmup_left > 0:
            self._warmup_left -= 1
            self._write_sample(self.current, score, "warmup")
            if self._warmup_left == 0:
                self._start_phase()
                return self._next_candidate()
            return None
        self._write_sample(self.current, score, self._phases[0][0] if self._phases else "")
        if score > self._best_score:
            self.best, self._best_score = self.current, score
        self._samples_of_current += 1
        if self._samples_of_current < self._samples_per_candidate:
            return None
        return self._next_candidate()

    def _start_phase(self) -> None:
        knob, values = self._phases[0]
        base = self.best or self.current
        self._queue = [dataclasses.replace(base, **{knob: value}) for value in values]

    def _next_candidate(self) -> Optional[Setting]:
        self._samples_of_current = 0
        while not self._queue:
            self._phases.pop(0)
            if not self._phases:
                return self._finish()
            self._start_phase()
        self.current = self._queue.pop(0)
        return self.current

    def _finish(self) -> Setting:
        self.done = True
        self.current = self.best
        self._write(f"chosen,{self.best.fusion_bytes / MIB:g},{self.best.cycle_ms:g},{self.best.algorithm or ''},"
                    f"{self._best_score:.6g},")
        if self._log is not None:
            self._log.close()
        print(f"hvdplus autotune: chose {self.best.describe()} ({self._best_score / 1e6:.1f} MB/s all-reduced)",
              file=sys.stderr, flush=True)
        return self.best

    def _write_sample(self, setting: Setting, score: float, phase: str) -> None:
        self._write(f"{self._sample_index},{setting.fusion_bytes / MIB:g},{setting.cycle_ms:g},"
                    f"{setting.algorithm or ''},{score:.6g},{phase}")

    def _write(self, line: str) -> None:
        if self._log is not None:
            self._log.write(line + "\n")
            self._log.flush()


class TuningDriver:
    """The autotuner in rank 0's engine cycle: it scores each cycle by the bytes its batches
    all-reduced, and sends each move to every rank as a TUNE batch ahead of the next batches,
    so all ranks apply it between the same two.

    Args:
        settings: the job's settings (the starting threshold and cycle time, the log).
        algorithms: the engine's CollectiveAlgorithms; the algorithm is tuned across nodes
            only, since on one node the engine reduces in shared memory whatever the setting.
    """

    def __init__(self, settings, algorithms):
        choices = () if algorithms.single_node else ("hierarchical", "ring", "mpi")
        start = Setting(settings.fusion_threshold_bytes, settings.cycle_time_ms,
                        algorithms.choose(1 << 30) if choices else None)
        self.tuner = Autotuner(start, choices, settings.autotune_warmup_samples, settings.autotune_steps_per_sample,
                               log_path=settings.autotune_log)
        self._move: Optional[Batch] = None

    def take_move(self) -> Optional[Batch]:
        """The TUNE batch to send before this cycle's batches, once."""
        move, self._move = self._move, None
        return move

    def score(self, batches, coordinator) -> None:
        """Record the cycle that ran `batches`; the coordinator fuses by the next setting's
        threshold from now on."""
        nbytes = sum(fused_nbytes(request) for batch in batches
                     if batch.kind is _ALLREDUCE and batch.error is None and batch.requests
                     for request in batch.requests)
        setting = self.tuner.record(nbytes)
        if setting is not None:
            coordinator.fusion_threshold = setting.fusion_bytes
            self._move = Batch(Outcome.TUNE, value=dataclasses.astuple(setting))

    @property
    def chosen(self) -> Optional[Setting]:
        """The setting the tuner chose, once it has; else None."""
        return self.tuner.best if self.tuner.done else None
