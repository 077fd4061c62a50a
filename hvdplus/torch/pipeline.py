"""Pipeline parallelism: a model split into stages over the ranks of a process set.

    stages = split_sequential(model, parts=2, balance="time", sample=x[:8])  # every rank
    pipe = Pipeline(stages, process_set=pipeline_ranks, chunks=8, loss_fn=F.cross_entropy)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(pipe.module.parameters(), lr=0.1),
                                         process_set=replicas_of_my_stage,
                                         backward_passes_per_step=pipe.chunks)
    loss = pipe.train_step(x, y)       # the first stage uses x, the last y; others pass None
    optimizer.step()

Rank i of the process set runs stage i. `train_step` splits the batch into `chunks`
micro-batches, runs their forward and backward passes in the order of the schedule,
passing activations to the next stage and gradients to the previous one with hvdplus'
point-to-point messages, and leaves in the stage's parameters the gradient of the mean of
the micro-batches' losses: that of the whole batch, for a loss that averages over samples
and micro-batches of equal size. Schedules:

- "gpipe": every forward pass, then every backward pass; a stage holds the activations of
  all `chunks` micro-batches at once;
- "1f1b": after S - 1 - i forward passes (S stages, i this stage), one forward and one
  backward pass in turn; a stage holds at most S - i micro-batches' activations.

Both idle (S - 1) / (chunks + S - 1) of each step when the stages cost the same: more
micro-batches make the bubble smaller. With data parallelism, each stage's gradients are
averaged over its replicas by a DistributedOptimizer on the set of those replicas, which
counts `chunks` backward passes per step.
"""

import time
from typing import List, Optional, Sequence, Union

import torch

from ..common.contiguous_split import balanced_counts
from ..core.process_sets import global_process_set, rank_in, ranks_in, size_in
from . import stage_costs
from .p2p import recv, send_async

__all__ = ["Pipeline", "split_sequential", "schedule", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b")
# Each message of a micro-batch carries a header of its dtype and shape first: the
# receiving stage knows neither before the sending stage has run.
_HEADER_LENGTH = 10
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32]
# The tag of evaluate()'s micro-batch count, apart from every micro-batch's tags.
_COUNT_TAG = 30000


def split_sequential(model: torch.nn.Sequential, parts: int, balance: Union[None, str, Sequence[int]] = None,
                     sample: Optional[torch.Tensor] = None, process_set=global_process_set):
    """`model`'s layers as `parts` consecutive nn.Sequentials, the same on every rank.

    Args:
        model: the whole model, alike on every rank.
        parts: how many stages.
        balance: how many layers each stage takes:
            None: as even a split as the layer count allows;
            a list of `parts` counts;
            "time": the split whose slowest stage is fastest, by each layer's forward and
            backward time on `sample` (stage_costs.layer_seconds), measured on the first rank
            of `process_set`, whose costs every rank uses;
            "parameters": the split whose largest stage has the fewest parameters (memory).
        sample: for "time", a batch for the first layer, of the size a micro-batch will have.
        process_set: the ranks that call this together (for "time"); none where hvdplus is
            not initialized.
    """
    layers = list(model)
    if isinstance(balance, str):
        balance = _balanced_by(balance, layers, parts, sample, process_set)
    elif balance is None:
        base, extra = divmod(len(layers), parts)
        balance = [base + (i < extra) for i in range(parts)]
    if len(balance) != parts or sum(balance) != len(layers) or min(balance) < 1:
        raise ValueError(f"split_sequential: balance {list(balance)} does not split {len(layers)} layers "
                         f"into {parts} non-empty parts")
    stages, start = [], 0
    for count in balance:
        stages.append(torch.nn.Sequential(*layers[start:start + count]))
        start += count
    return stages


def _balanced_by(measure: str, layers, parts: int, sample, process_set) -> List[int]:
    if parts > len(layers):
        raise ValueError(f"split_sequential: {len(layers)} layers cannot make {parts} non-empty parts")
    if measure == "parameters":
        costs = stage_costs.layer_parameters(layers)
    elif measure == "time":
        if sample is None:
            raise ValueError('split_sequential: balance="time" needs sample=, a batch for the first layer')
        costs = stage_costs.measured_on_first_rank(lambda: stage_costs.layer_seconds(layers, sample), process_set)
    else:
        raise ValueError(f'split_sequential: balance {measure!r}, expected "time", "parameters", '
                         f"a list of layer counts or None")
    return balanced_counts(costs, parts)


def schedule(kind: str, stage: int, stages: int, chunks: int) -> List[tuple]:
    """The ("forward" | "backward", micro-batch) steps that stage `stage` of `stages` runs."""
    if kind == "gpipe":
        return [("forward", m) for m in range(chunks)] + [("backward", m) for m in range(chunks)]
    if kind == "1f1b":
        warmup = min(stages - stage - 1, chunks)
        steps = [("forward", m) for m in range(warmup)]
        for m in range(chunks - warmup):
            steps += [("forward", warmup + m), ("backward", m)]
        return steps + [("backward", m) for m in range(chunks - warmup, chunks)]
    raise ValueError(f"schedule {kind!r}: expected one of {', '.join(SCHEDULES)}")


class Pipeline(torch.nn.Module):
    """This rank's stage of a pipeline over `process_set` (stage i on the set's rank i).

    Args:
        stages: one module per stage, the same list on every rank of the set.
        chunks: micro-batches per step; the batch splits along its first dimension.
        schedule: "1f1b" (default) or "gpipe".
        loss_fn: `loss_fn(output, target)` on the last stage, averaging over samples.
    """

    def __init__(self, stages: Sequence[torch.nn.Module], process_set=global_process_set, chunks: int = 4,
                 schedule: str = "1f1b", loss_fn=torch.nn.functional.mse_loss):
        super().__init__()
        size = size_in(process_set, "Pipeline")
        if len(stages) != size:
            raise ValueError(f"Pipeline: {len(stages)} stages for a process set of {size} ranks")
        if schedule not in SCHEDULES:
            raise ValueError(f"Pipeline: schedule {schedule!r}, expected one of {', '.join(SCHEDULES)}")
        self.process_set = process_set
        self.stage, self.num_stages = rank_in(process_set, "Pipeline"), size
        self.module = stages[self.stage]
        self.chunks = chunks
        self.schedule = schedule
        self.loss_fn = loss_fn
        ranks = ranks_in(process_set, "Pipeline")
        self._previous = ranks[self.stage - 1] if self.stage > 0 else None
        self._next = ranks[self.stage + 1] if self.stage + 1 < self.num_stages else None
        # Seconds of the last step, and those of them this stage spent computing.
        self.last_step_seconds = 0.0
        self.last_busy_seconds = 0.0

    @property
    def is_first(self) -> bool:
        return self._previous is None

    @property
    def is_last(self) -> bool:
        return self._next is None

    def forward(self, x):
        """This stage's module alone (for inference on one stage's activations)."""
        return self.module(x)

    def train_step(self, inputs: Optional[torch.Tensor] = None, targets: Optional[torch.Tensor] = None):
        """One training step's forward and backward passes; returns the batch's loss on the
        last stage (None on the others). The gradients accumulate into the parameters."""
        started = time.perf_counter()
        self.last_busy_seconds = 0.0
        for batch in (inputs if self.is_first else None, targets if self.is_last else None):
            if batch is not None and len(batch) < self.chunks:
                raise ValueError(f"Pipeline: a batch of {len(batch)} samples cannot make {self.chunks} micro-batches")
        # Micro-batches of sizes that differ by at most one row; equal ones, for a batch that
        # divides by `chunks`, make the step's gradient exactly the whole batch's.
        inputs_of = inputs.tensor_split(self.chunks) if self.is_first else None
        targets_of = targets.tensor_split(self.chunks) if self.is_last else None
        live, sends, losses = {}, [], []
        for kind, micro in schedule(self.schedule, self.stage, self.num_stages, self.chunks):
            if kind == "forward":
                live[micro] = self._forward(micro, inputs_of, targets_of, sends, losses)
            else:
                self._backward(micro, *live.pop(micro), sends)
        for handle in sends:
            handle.wait()
        self.last_step_seconds = time.perf_counter() - started
        return torch.stack(losses).sum().detach() if self.is_last else None

    @torch.no_grad()
    def evaluate(self, inputs: Optional[torch.Tensor] = None):
        """The model's output for `inputs` (given on the first stage), on the last stage
        (None on the others): forward passes only, micro-batch by micro-batch."""
        inputs_of = inputs.tensor_split(min(self.chunks, len(inputs))) if self.is_first else None
        count = len(inputs_of) if self.is_first else None
        if self.is_first and not self.is_last:
            send_async(torch.tensor([count]), self._next, tag=_COUNT_TAG).wait()
        elif not self.is_first:
            count = int(recv(torch.zeros(1, dtype=torch.int64), self._previous, tag=_COUNT_TAG)[0])
            if not self.is_last:
                send_async(torch.tensor([count]), self._next, tag=_COUNT_TAG).wait()
        outputs, sends = [], []
        for micro in range(count):
            x = inputs_of[micro] if self.is_first else self._receive(self._previous, 2 * micro)
            y = self.module(x)
            if self.is_last:
                outputs.append(y)
            else:
                sends.extend(self._send(y, self._next, 2 * micro))
        for handle in sends:
            handle.wait()
        return torch.cat(outputs) if self.is_last else None

    def _forward(self, micro, inputs_of, targets_of, sends, losses):
        if self.is_first:
            x = inputs_of[micro]
        else:
            x = self._receive(self._previous, 2 * micro).requires_grad_()
        with self._busy():
            y = self.module(x)
            if self.is_last:
                y = self.loss_fn(y, targets_of[micro]) / self.chunks
                losses.append(y.detach())
        if not self.is_last:
            sends.extend(self._send(y.detach(), self._next, 2 * micro))
        return x, y

    def _backward(self, micro, x, y, sends):
        grad = None if self.is_last else self._receive(self._next, 2 * micro + 1)
        with self._busy():
            y.backward(grad)
        if not self.is_first:
            sends.extend(self._send(x.grad, self._previous, 2 * micro + 1))

    def _send(self, tensor, dst, tag):
        header = torch.zeros(_HEADER_LENGTH, dtype=torch.int64)
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        return [send_async(header, dst, tag=2 * tag), send_async(tensor.contiguous(), dst, tag=2 * tag + 1)]

    def _receive(self, src, tag):
        header = recv(torch.zeros(_HEADER_LENGTH, dtype=torch.int64), src, tag=2 * tag)
        shape = [int(d) for d in header[2:2 + int(header[1])]]
        return recv(shape, src, tag=2 * tag + 1, dtype=_DTYPES[int(header[0])])

    def _busy(self):
        return _Stopwatch(self)


class _Stopwatch:
    """Adds the time spent in its block to the pipeline's busy seconds."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def __enter__(self):
        self.started = time.perf_counter()

    def __exit__(self, *exc):
        self.pipeline.last_busy_seconds += time.perf_counter() - self.started
