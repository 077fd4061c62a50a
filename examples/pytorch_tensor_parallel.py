"""Tensor parallelism: an MLP block whose two layers are split over every rank, trained on
scikit-learn's bundled digits with hvdplus.torch.

    hvdplusrun -np 2 python examples/pytorch_tensor_parallel.py

The hidden layer's 256 units are split evenly over the ranks: each rank holds a slice of
the first layer's outputs (ColumnParallelLinear) and of the second layer's inputs
(RowParallelLinear), computes its part of every sample, and one all-reduce sums the parts.
Every rank sees the same batches; the model equals the unsplit one, which the last line
checks against a copy trained in one process alone.
"""

import argparse
import copy

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdplus.torch as hvd
from hvdplus.torch.parallel import ColumnParallelLinear, RowParallelLinear

HIDDEN = 256


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    return parser.parse_args()


def train(model, x, y, args):
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(x), args.batch_size):
            rows = order[start:start + args.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
    return model


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.25, random_state=42, stratify=y)

    torch.manual_seed(0)
    hidden, output = torch.nn.Linear(64, HIDDEN), torch.nn.Linear(HIDDEN, 10)
    alone = torch.nn.Sequential(copy.deepcopy(hidden), torch.nn.ReLU(), copy.deepcopy(output))
    split = torch.nn.Sequential(ColumnParallelLinear.from_linear(hidden), torch.nn.ReLU(),
                                RowParallelLinear.from_linear(output))
    train(split, train_x, train_y, args)
    with torch.no_grad():
        logits = split(test_x)  # on every rank: the split layers sum their parts over all of them
    accuracy = (logits.argmax(1) == test_y).float().mean().item()
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {HIDDEN // hvd.size()} hidden units each: test accuracy {accuracy:.4f}")
        train(alone, train_x, train_y, args)
        with torch.no_grad():
            gap = (logits - alone(test_x)).abs().max().item()
        print(f"largest difference from the unsplit model trained alone: {gap:.2e}", flush=True)


if __name__ == "__main__":
    main()
