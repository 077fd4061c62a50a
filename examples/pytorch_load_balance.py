"""Training on ranks of different speeds: each rank's batch follows its measured speed.

    hvdplusrun -np 2 python examples/pytorch_load_balance.py --slow-rank 1 --slowdown 2

A LoadBalancer sizes each rank's share of every global batch by how fast the rank computes,
BalancedSampler hands the DataLoader those shares, and DistributedOptimizer weighs each rank's
gradient by its sample count: the steps are those of one process on the global batches,
whatever the shares, while the slow rank (made slow here by computing each pass again) no
longer holds the fast ones back. Rank 0 prints the shares and the loss after each epoch.
"""

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdplus.torch as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=128, help="samples per step over every rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank to slow down (none: no rank)")
    parser.add_argument("--slowdown", type=int, default=2, help="how many times the slow rank computes each pass")
    return parser.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    data = load_digits()
    dataset = TensorDataset(torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target))
    torch.manual_seed(0)
    # Wide enough that a step costs its samples' compute more than its fixed costs: a balancer makes
    # the ranks' step times equal, and a model that costs little per sample leaves the slow rank only
    # the few samples that its repeated fixed costs allow.
    model = nn.Sequential(nn.Linear(64, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10))
    burden = copy.deepcopy(model)  # the slow rank's extra passes: they cost and change nothing

    balancer = hvd.LoadBalancer(global_batch_size=args.global_batch, min_batch_size=4)
    sampler = hvd.BalancedSampler(dataset, balancer, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    slow = hvd.rank() == args.slow_rank

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            optimizer.set_local_samples(len(x))  # the last, smaller batch is not split by the balancer
            start = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            for _ in range(args.slowdown - 1 if slow else 0):
                F.cross_entropy(burden(x), y).backward()
            balancer.record(len(x), time.perf_counter() - start)
            optimizer.step()
            balancer.rebalance()
        with torch.no_grad():
            inputs, targets = dataset.tensors
            loss = F.cross_entropy(model(inputs), targets).item()
            accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}  shares {balancer.sizes()}  loss {loss:.6f}  accuracy {accuracy:.4f}", flush=True)
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}  final loss {loss:.6f}  accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
