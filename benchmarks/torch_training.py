"""Training throughput of hvdplus.torch against DDP (gloo) and communication-free ranks.

    hvdplusrun -np 2 python benchmarks/torch_training.py

For a ResNet-style CNN and a deep MLP (24 layers of width 256, batch 64 per rank), with one
thread per rank, measures in the same job, taking turns (harness.interleaved_throughputs):
hvdplus' DistributedOptimizer; torch DDP over gloo; a plain loop that all-reduces each
gradient with mpi4py after backward (the naive peer); every rank training its own copy
without any communication ("independent ranks", what this machine can give n ranks at
all); and one rank alone. Prints samples/s and the ratios between them: scaling efficiency
is hvdplus / independent ranks, and each peer's own efficiency is the same ratio of its
own. Writes the same to benchmarks/results/torch_training_np<ranks>.csv (see
harness.write_results).
"""

import argparse

import torch
from mpi4py import MPI

import hvdplus.torch as hvd
from harness import (add_csv_option, init_gloo, interleaved_throughputs, mpi4py_average_in_place,
                     print_throughput_rows, ratio, throughput_rows, write_results)

WORLD = MPI.COMM_WORLD


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


def synthetic_cnn():
    layers = [torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU()]
    for channels in (32, 64):
        if channels != 32:
            layers += [torch.nn.Conv2d(32, channels, 3, stride=2, padding=1), torch.nn.ReLU()]
        layers += [ResidualBlock(channels), ResidualBlock(channels)]
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)]
    return torch.nn.Sequential(*layers)


def deep_mlp(width=256, depth=24):
    layers = [torch.nn.Linear(width, width)]
    for _ in range(depth - 1):
        layers += [torch.nn.ReLU(), torch.nn.Linear(width, width)]
    return torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(width, 10))


MODELS = {
    "cnn": (synthetic_cnn, lambda batch: torch.randn(batch, 3, 32, 32), 32),
    "mlp": (deep_mlp, lambda batch: torch.randn(batch, 256), 64),
}


def train_steps(model, optimizer, data, target, steps, after_backward=None):
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        if after_backward is not None:
            after_backward(model)
        optimizer.step()


def mpi4py_average(model):
    """The issue's naive peer: each gradient all-reduced by mpi4py after backward, one by one."""
    mpi4py_average_in_place([p.grad.numpy() for p in model.parameters()])


def measure(name, steps):
    build, make_data, batch = MODELS[name]
    torch.manual_seed(hvd.rank())
    data, target = make_data(batch), torch.randint(0, 10, (batch,))
    model = build()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ddp = torch.nn.parallel.DistributedDataParallel(build())
    ddp_optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    naive = build()
    naive.load_state_dict(model.state_dict())
    naive_optimizer = torch.optim.SGD(naive.parameters(), lr=0.01, momentum=0.9)
    alone = build()
    alone_optimizer = torch.optim.SGD(alone.parameters(), lr=0.01, momentum=0.9)

    def rank_zero_only(n):
        if hvd.rank() == 0:
            train_steps(alone, alone_optimizer, data, target, n)

    runs = {
        "hvdplus": (lambda n: train_steps(model, optimizer, data, target, n), hvd.size()),
        "DDP gloo": (lambda n: train_steps(ddp, ddp_optimizer, data, target, n), hvd.size()),
        "mpi4py loop": (lambda n: train_steps(naive, naive_optimizer, data, target, n, mpi4py_average),
                        hvd.size()),
        "independent ranks": (lambda n: train_steps(alone, alone_optimizer, data, target, n), hvd.size()),
        "one rank alone": (rank_zero_only, 1),
    }
    return interleaved_throughputs(runs, batch, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps per run in each of 9 rounds")
    parser.add_argument("--models", default="cnn,mlp")
    add_csv_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    dist = init_gloo(WORLD)
    rows = []
    for name in args.models.split(","):
        results = measure(name, args.steps)
        n = hvd.size()
        model_rows = throughput_rows(results, [
            ratio(results, "hvdplus", "independent ranks"),
            ratio(results, "mpi4py loop", "independent ranks"),
            ratio(results, "DDP gloo", "independent ranks"),
            ratio(results, "hvdplus", "DDP gloo"),
            ratio(results, "hvdplus", "mpi4py loop"),
            ratio(results, "hvdplus", "one rank alone", times=n),
            ratio(results, "independent ranks", "one rank alone", times=n),
        ], model=name, batch_per_rank=MODELS[name][2], steps=args.steps)
        if hvd.rank() == 0:
            print(f"\n{name}: {n} ranks, 1 thread each, samples/s of all ranks together")
            print_throughput_rows(model_rows)
        rows += model_rows
    write_results("torch_training", rows, {"torch": torch.__version__}, args.csv)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
