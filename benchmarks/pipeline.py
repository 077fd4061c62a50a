"""Pipeline parallelism's bubble and activation memory, measured.

    hvdplusrun -np 2 python benchmarks/pipeline.py

An MLP of equal stages (width 1024, 4 layers per stage, micro-batches of 64 rows) runs on
S ranks (one stage each) with the GPipe and 1F1B schedules and M micro-batches per step.
Every stage starts the step at a barrier; the pipeline's own clock gives each stage's
seconds spent computing (busy) and its seconds to the end of its part of the step. The
step lasts until the last stage to finish is done, so a stage's bubble is 1 - busy / (the
slowest stage's seconds), which the theory puts at (S - 1) / (M + S - 1) for either
schedule when the stages cost the same and messages cost nothing. The first stage costs
less than the others, having no gradient to compute for its input, so it idles more: the
busiest stage's bubble is the one to hold against the theory. The peak
activation memory is what autograd holds for backward at its highest during a step,
counted tensor by tensor as autograd saves and frees them (saved_tensors_hooks). Each
number is the median of `--steps` steps after two warm-up steps.

Writes benchmarks/results/pipeline_np<ranks>.csv (see harness.write_results).
"""

import argparse
import statistics

import torch

import hvdplus.torch as hvd
from harness import add_csv_option, write_results
from hvdplus.torch.pipeline import Pipeline

WIDTH, LAYERS_PER_STAGE, MICRO_ROWS = 1024, 4, 64


class SavedActivations:
    """The bytes autograd holds for backward, now and at their highest."""

    def __init__(self):
        self.now = self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor):
        return _Held(tensor, self)

    @staticmethod
    def _unpack(held):
        return held.tensor


class _Held:
    """A saved tensor, counted while autograd keeps it."""

    def __init__(self, tensor, counter):
        self.tensor, self.counter = tensor, counter
        self.nbytes = tensor.numel() * tensor.element_size()
        counter.now += self.nbytes
        counter.peak = max(counter.peak, counter.now)

    def __del__(self):
        self.counter.now -= self.nbytes


def stage_module():
    layers = []
    for _ in range(LAYERS_PER_STAGE):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def measure(kind, chunks, steps):
    torch.manual_seed(0)
    stages = [stage_module() for _ in range(hvd.size())]
    pipe = Pipeline(stages, chunks=chunks, schedule=kind)
    rows = MICRO_ROWS * chunks
    x, y = torch.randn(rows, WIDTH), torch.randn(rows, WIDTH)
    bubbles, busy, seconds, peaks = [], [], [], []
    for step in range(steps + 2):
        saved = SavedActivations()
        hvd.barrier()
        with saved.hooks():
            pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None)
        pipe.module.zero_grad()
        step_seconds = hvd.allreduce(torch.tensor(pipe.last_step_seconds), op=hvd.Max, name="step seconds").item()
        if step >= 2:
            busy.append(pipe.last_busy_seconds)
            seconds.append(step_seconds)
            bubbles.append(1 - pipe.last_busy_seconds / step_seconds)
            peaks.append(saved.peak)
    stages = hvd.size()
    return {"schedule": kind, "stages": stages, "chunks": chunks, "stage": hvd.rank(),
            "busy_s": statistics.median(busy), "step_s": statistics.median(seconds),
            "bubble": statistics.median(bubbles), "expected_bubble": (stages - 1) / (chunks + stages - 1),
            "peak_activation_bytes": max(peaks)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="2,4,8", help="micro-batches per step, comma-separated")
    parser.add_argument("--steps", type=int, default=5)
    add_csv_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    if hvd.size() < 2:
        raise SystemExit("a pipeline needs at least 2 ranks")
    rows = []
    for chunks in (int(c) for c in args.chunks.split(",")):
        for kind in ("gpipe", "1f1b"):
            mine = measure(kind, chunks, args.steps)
            every = hvd.allgather_object(mine, name=f"{kind}.{chunks}")
            rows += every
            if hvd.rank() == 0:
                for row in every:
                    print(f"{kind:5s} M={chunks} stage {row['stage']}: busy {row['busy_s'] * 1e3:7.1f} ms of "
                          f"{row['step_s'] * 1e3:7.1f} ms, bubble {row['bubble']:.3f} "
                          f"(theory {row['expected_bubble']:.3f}), peak activations "
                          f"{row['peak_activation_bytes'] / 2**20:6.1f} MiB", flush=True)
                # The busiest stage sets the pace; the others idle the more, the less they compute
                # (the first stage computes no gradient for its input).
                slowest = max(every, key=lambda row: row["busy_s"])
                print(f"{kind:5s} M={chunks}: the busiest stage's bubble is {slowest['bubble']:.3f}, "
                      f"{slowest['bubble'] - slowest['expected_bubble']:+.3f} from the theory\n", flush=True)
    write_results("pipeline", rows, {"torch": torch.__version__}, args.csv)


if __name__ == "__main__":
    main()
