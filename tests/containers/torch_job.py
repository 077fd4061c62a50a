"""Run in every rank of a job across containers (tests/test_containers.py): trains a small
MLP with hvdplus.torch's DistributedOptimizer, each rank on its rows of every batch, and
checks its parameters against one process training on the whole batch, without hvdplus.
The gradients (about 170 KB) are large enough to cross the hosts by the hierarchical
all-reduce. Prints one line per rank: "trained <rank> on <host>"."""

import socket

import torch

import hvdplus.torch as hvd

PER_RANK = 8
STEPS = 6


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 640), torch.nn.Tanh(), torch.nn.Linear(640, 4))


def batches(size):
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(size * PER_RANK, 64, generator=generator),
             torch.randn(size * PER_RANK, 4, generator=generator)) for _ in range(STEPS)]


def train(model, optimizer, data, rows):
    for x, y in data:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        optimizer.step()


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data = batches(size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters())
    train(model, optimizer, data, slice(rank * PER_RANK, (rank + 1) * PER_RANK))
    reference = make_model()
    train(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), data, slice(None))
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-5, msg=name)
    print(f"trained {rank} on {socket.gethostname()}", flush=True)


if __name__ == "__main__":
    main()
