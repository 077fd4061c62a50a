"""Training throughput of a small ResNet on random images, in images per second.

    hvdplusrun -np 2 python examples/pytorch_synthetic_benchmark.py --fp16-allreduce

Each iteration times --num-batches-per-iter training steps on every rank; the ranks' rates
are summed with an all-reduce outside the timed region, so "Total img/sec" is what the job
achieved, not rank 0's rate times size(). The spread is 1.96 standard deviations over the
iterations (a 95% interval).
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hvdplus.torch as hvd


class ResidualBlock(nn.Module):
    """Two conv-bn stages and a shortcut; a 1x1 conv-bn shortcut when shape changes."""

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A conv-bn-relu stem, three stages of residual blocks (width doubling, resolution
    halving), global average pooling and a linear classifier."""

    def __init__(self, num_classes, widths=(32, 64, 128)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
        )
        blocks, channels = [], widths[0]
        for index, width in enumerate(widths):
            blocks.append(ResidualBlock(channels, width, stride=1 if index == 0 else 2))
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, images):
        x = self.blocks(self.stem(images))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="images per step on each rank")
    parser.add_argument("--image-size", type=int, default=32, help="height and width of the images")
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--num-warmup-batches", type=int, default=5, help="untimed steps before the first iteration")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps timed together")
    parser.add_argument("--num-iters", type=int, default=5, help="timed iterations")
    parser.add_argument("--fp16-allreduce", action="store_true", help="all-reduce gradients as float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-threads", type=int, default=None,
                        help="torch threads per rank (default: $OMP_NUM_THREADS, else 1)")
    args = parser.parse_args()
    if args.num_iters < 1 or args.num_batches_per_iter < 1:
        parser.error("--num-iters and --num-batches-per-iter must be at least 1")
    return args


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.num_threads or int(os.environ.get("OMP_NUM_THREADS", 1)))
    torch.manual_seed(args.seed)
    is_root = hvd.rank() == 0

    model = SmallResNet(args.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # One batch, drawn once: the benchmark measures compute and communication, not loading.
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, args.num_classes, (args.batch_size,))

    def train_step():
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    if is_root:
        print(f"Model: SmallResNet, batch size {args.batch_size} per rank, {args.image_size}x{args.image_size} "
              f"images, {hvd.size()} rank(s), {torch.get_num_threads()} thread(s) per rank, "
              f"fp16 all-reduce {'on' if args.fp16_allreduce else 'off'}", flush=True)
    for _ in range(args.num_warmup_batches):
        train_step()

    totals = []
    for iteration in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            train_step()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        total = hvd.allreduce(torch.tensor(rate, dtype=torch.float64), op=hvd.Sum, name="img_sec").item()
        totals.append(total)
        if is_root:
            print(f"Iter #{iteration}: {total / hvd.size():.1f} img/sec per rank, {total:.1f} in total",
                  flush=True)

    if is_root:
        mean, spread = np.mean(totals), 1.96 * np.std(totals)
        print(f"Img/sec per rank: {mean / hvd.size():.1f} +- {spread / hvd.size():.1f}")
        print(f"Total img/sec on {hvd.size()} rank(s): {mean:.1f} +- {spread:.1f}", flush=True)


if __name__ == "__main__":
    main()
