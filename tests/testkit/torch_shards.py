"""A small torch model that each rank trains on its own rows of every batch through
DistributedOptimizer, and the check that it ends where one process training on whole batches
ends. For the ways of starting a job from a driver (hvdplus.ray, hvdplus.spark):

    results = start_job(train_on_shards, args=(model, batches()))   # each rank's parameters
    assert_trains_like_one_process(results, model, batches())

Its functions travel to the ranks whole (`register_by_value`), since the ranks cannot import testkit.
"""

import sys

import torch

ROWS_PER_RANK = 4


def register_by_value(*picklers) -> None:
    """Have each cloudpickle (the standalone one, Spark's) send this module's functions whole."""
    for pickler in picklers:
        pickler.register_pickle_by_value(sys.modules[__name__])


def batches(ranks: int = 2):
    generator = torch.Generator().manual_seed(5)
    rows = ranks * ROWS_PER_RANK
    return [(torch.randn(rows, 6, generator=generator), torch.randn(rows, 1, generator=generator)) for _ in range(5)]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train_on_shards(make_model, batches):
    """On a rank: the model's parameters after SGD with momentum on this rank's rows."""
    import hvdplus.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    net = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=net.named_parameters())
    rows = slice(hvd.rank() * ROWS_PER_RANK, (hvd.rank() + 1) * ROWS_PER_RANK)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
        optimizer.step()
    return [parameter.detach().clone() for parameter in net.parameters()]


def assert_trains_like_one_process(results, make_model, batches):
    reference = make_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
    for rank_parameters in results:
        for mine, theirs in zip(rank_parameters, reference.parameters()):
            torch.testing.assert_close(mine, theirs.detach(), rtol=1e-5, atol=1e-6)
