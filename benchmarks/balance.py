"""Load balance for ranks of different speeds, against the equal batches every peer uses.

    hvdplusrun -np 2 python benchmarks/balance.py
    hvdplusrun -np 4 python benchmarks/balance.py

The last rank is made `--slowdown` times slower (2 by default) by running each forward and
backward pass again on a twin of the model, as a slower device or a busy neighbour would slow
it. Each measurement is one row of benchmarks/results/balance_np<ranks>.csv:

- `throughput`: samples per second of an MLP's training steps (compute and the gradients'
  all-reduce) with equal local batches, as Horovod and DDP run, and with `hvd.LoadBalancer`
  sizing them (the DistributedOptimizer weighing the gradients by them); `ideal` is the sum of
  the ranks' own compute speeds, measured during the equal run: what perfect balance with free
  communication would reach. `known sizes`: fixed local batches in proportion to those
  measured speeds, set before the run and never measured again (the gradients weighed by
  them): the most any balancer that sizes batches can reach here, its ceiling, since it
  pays the same communication and per-step costs as the balancer.
- `adapt`: the last rank turns slow halfway through a run; the steps from then until its size
  is within 10 % of where it settles.
- `digits`: test accuracy on scikit-learn's digits after `--epochs` epochs, with and without the
  balancer (the same global batches, so the same mathematics up to rounding).
- `pipeline`: the step time of a pipeline over every rank, of layers whose costs are uneven (the
  last ones three times the others), cut by layer count and by measured time.

Each rank computes on one thread; at more ranks than cores, ranks share cores, which evens out
part of what the slow rank costs.
"""

import argparse
import copy
import statistics
import time

import numpy as np
import torch

import hvdplus.torch as hvd
from harness import add_csv_option, write_results
from hvdplus.common.batch_sizes import balanced_sizes
from hvdplus.torch.pipeline import Pipeline, split_sequential

WIDTH, FEATURES, CLASSES = 512, 64, 10


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                               torch.nn.Linear(WIDTH, CLASSES))


class Trainer:
    """An MLP's data-parallel training with the last rank `slowdown` times slower once slowed."""

    def __init__(self, global_batch, balanced, slowdown, lr=0.05, known_sizes=None):
        self.model = mlp()
        self.twin = copy.deepcopy(self.model)  # the slow rank's repeats: cost only
        self.balancer = hvd.LoadBalancer(global_batch, min_batch_size=8) if balanced else None
        self.optimizer = hvd.DistributedOptimizer(torch.optim.SGD(self.model.parameters(), lr=lr),
                                                  named_parameters=self.model.named_parameters(),
                                                  load_balancer=self.balancer)
        self.global_batch, self.slowdown, self.slowed = global_batch, slowdown, True
        self.known_sizes = known_sizes
        self.compute_seconds, self.samples = 0.0, 0

    def share(self, indices):
        """This rank's part of a global batch's indices."""
        if self.balancer is not None:
            return self.balancer.slice(indices)
        if self.known_sizes is not None:
            start = sum(self.known_sizes[:hvd.rank()])
            return indices[start:start + self.known_sizes[hvd.rank()]]
        size, rank = hvd.size(), hvd.rank()
        return indices[rank * len(indices) // size:(rank + 1) * len(indices) // size]

    def step(self, x, y):
        start = time.perf_counter()
        if self.known_sizes is not None:
            self.optimizer.set_local_samples(len(x))
        self.optimizer.zero_grad()
        torch.nn.functional.cross_entropy(self.model(x), y).backward()
        if self.slowed and hvd.rank() == hvd.size() - 1:
            for _ in range(round(self.slowdown) - 1):
                torch.nn.functional.cross_entropy(self.twin(x), y).backward()
        seconds = time.perf_counter() - start
        self.compute_seconds += seconds
        self.samples += len(x)
        if self.balancer is not None:
            self.balancer.record(len(x), seconds)
        self.optimizer.step()
        if self.balancer is not None:
            self.balancer.rebalance()

    def sizes(self):
        if self.balancer is not None:
            return self.balancer.sizes()
        if self.known_sizes is not None:
            return list(self.known_sizes)
        size = hvd.size()
        return [(r + 1) * self.global_batch // size - r * self.global_batch // size for r in range(size)]


def throughput(balanced, global_batch, steps, slowdown, known_sizes=None):
    """(samples/s, each rank's own compute speed, the sizes at the end)."""
    trainer = Trainer(global_batch, balanced, slowdown, known_sizes=known_sizes)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(global_batch, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (global_batch,), generator=generator)
    indices = np.arange(global_batch)
    for step in range(steps + 5):
        if step == 5:  # after warming up and the balancer's first moves
            hvd.barrier()
            start = time.perf_counter()
            trainer.compute_seconds, trainer.samples = 0.0, 0
        mine = torch.as_tensor(trainer.share(indices))
        trainer.step(x[mine], y[mine])
    hvd.barrier()
    seconds = time.perf_counter() - start
    speeds = hvd.allgather_object(trainer.samples / trainer.compute_seconds, name="balance.speeds")
    return steps * global_batch / seconds, speeds, trainer.sizes()


def steps_to_adapt(global_batch, steps, slowdown):
    trainer = Trainer(global_batch, True, slowdown)
    trainer.slowed = False
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(global_batch, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (global_batch,), generator=generator)
    indices, last, turn = np.arange(global_batch), [], steps // 2
    for step in range(steps):
        trainer.slowed = step >= turn
        mine = torch.as_tensor(trainer.share(indices))
        trainer.step(x[mine], y[mine])
        last.append(trainer.sizes()[-1])
    settled = statistics.median(last[-5:])
    adapted = next(step for step in range(turn, steps) if abs(last[step] - settled) <= 0.1 * settled)
    return adapted + 1 - turn, last[turn - 1], settled


def digits_accuracy(balanced, epochs, slowdown, global_batch=128):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(3))
    test, train = order[:360], order[360:]
    trainer = Trainer(global_batch, balanced, slowdown, lr=0.1)
    for epoch in range(epochs):
        shuffled = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(10 + epoch))]
        for start in range(0, len(shuffled) - global_batch + 1, global_batch):
            batch = shuffled[start:start + global_batch].numpy()
            mine = torch.as_tensor(trainer.share(batch))
            trainer.step(x[mine], y[mine])
    with torch.no_grad():
        return (trainer.model(x[test]).argmax(dim=1) == y[test]).float().mean().item()


class Repeated(torch.nn.Module):
    """A Linear and tanh applied `times` times: `times` as costly as once."""

    def __init__(self, times):
        super().__init__()
        self.linear, self.times = torch.nn.Linear(WIDTH, WIDTH), times

    def forward(self, x):
        for _ in range(self.times):
            x = torch.tanh(self.linear(x))
        return x


def pipeline_step_seconds(balance, steps, chunks=8, micro_rows=32):
    stages = hvd.size()
    costs = [1] * (2 * stages - 2) + [3, 3] if stages > 2 else [1, 1, 1, 3]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Repeated(cost) for cost in costs])
    sample = torch.randn(micro_rows, WIDTH)
    parts = split_sequential(model, stages, balance=balance, sample=sample)
    pipe = Pipeline(parts, chunks=chunks, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.randn(micro_rows * chunks, WIDTH), torch.randn(micro_rows * chunks, WIDTH)
    seconds = []
    for step in range(steps + 2):
        hvd.barrier()
        start = time.perf_counter()
        pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None)
        pipe.module.zero_grad()
        hvd.barrier()
        if step >= 2:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), [len(part) for part in parts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdown", type=float, default=2.0)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=15)
    add_csv_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rows = []

    def report(row):
        rows.append(row)
        if hvd.rank() == 0:
            print(", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in row.items()), flush=True)

    equal, speeds, _ = throughput(False, args.global_batch, args.steps, args.slowdown)
    ideal = sum(speeds)
    balanced, _, sizes = throughput(True, args.global_batch, args.steps, args.slowdown)
    known_sizes = balanced_sizes(speeds, args.global_batch, 8)
    known, _, _ = throughput(False, args.global_batch, args.steps, args.slowdown, known_sizes)
    report({"measure": "throughput", "slowdown": args.slowdown, "equal_samples_s": equal,
            "balanced_samples_s": balanced, "ideal_samples_s": ideal, "balanced_over_equal": balanced / equal,
            "balanced_over_ideal": balanced / ideal, "sizes": " ".join(map(str, sizes)),
            "known_sizes_samples_s": known, "known_sizes": " ".join(map(str, known_sizes)),
            "known_sizes_over_ideal": known / ideal, "balanced_over_known_sizes": balanced / known})
    adapted, before, settled = steps_to_adapt(args.global_batch, 2 * args.steps, args.slowdown)
    report({"measure": "adapt", "slowdown": args.slowdown, "steps_to_adapt": adapted,
            "size_before": before, "size_settled": settled})
    plain = digits_accuracy(False, args.epochs, args.slowdown)
    weighted = digits_accuracy(True, args.epochs, args.slowdown)
    report({"measure": "digits", "slowdown": args.slowdown, "accuracy_equal": plain, "accuracy_balanced": weighted,
            "accuracy_difference_points": 100 * (weighted - plain)})
    if hvd.size() >= 2:
        by_count, counts = pipeline_step_seconds(None, 5)
        by_time, timed = pipeline_step_seconds("time", 5)
        report({"measure": "pipeline", "stage_layers_by_count": " ".join(map(str, counts)),
                "stage_layers_by_time": " ".join(map(str, timed)), "step_s_by_count": by_count,
                "step_s_by_time": by_time, "time_over_count_speedup": by_count / by_time})
    write_results("balance", rows, {"torch": torch.__version__}, args.csv)


if __name__ == "__main__":
    main()
