"""The training that tests/mpi/test_torch_zero*.py compare ZeroRedundancyOptimizer on: a tiny
float64 model of six uneven parameters, whole batches alike in every job whatever its size,
each rank's even slice of them, and one process of plain torch as the reference."""

import os

import torch

import hvdplus.torch as hvd

__all__ = ["RTOL", "LR", "STEPS", "OPTIMIZERS", "CHECKPOINT_DIR", "make_model", "groups_of", "global_batch",
           "my_batch", "loss_of", "train", "train_plainly", "flat", "zero_optimizer", "state_bytes"]

RTOL = 1e-6
LR = 0.02
STEPS = 50
GLOBAL_BATCH = 12  # divides evenly over 2, 3 and 4 ranks
OPTIMIZERS = {
    "sgd-momentum": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": LR}),
    "adamw": (torch.optim.AdamW, {"lr": LR, "weight_decay": 0.1}),
}
# Where tests/test_zero.py has the 4-rank job save a checkpoint, for jobs of 2 and 3 to load.
CHECKPOINT_DIR = os.environ.get("HVDPLUS_ZERO_CHECKPOINT_DIR")


def make_model():
    """Six parameters of 35, 7, 21, 3, 6 and 2 elements: no number of ranks shares them evenly."""
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2)).double()


def groups_of(model, factor=0.5):
    """Two parameter groups, the first with a learning rate of its own."""
    params = list(model.parameters())
    return [{"params": params[:2], "lr": LR * factor}, {"params": params[2:]}]


def global_batch(step):
    """The whole batch of `step`, alike in every job whatever its size."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 5, generator=generator, dtype=torch.float64)
    y = torch.randn(GLOBAL_BATCH, 2, generator=generator, dtype=torch.float64)
    return x, y


def my_batch(step):
    """This rank's even slice of the whole batch: the average of the ranks' mean losses is the
    whole batch's mean loss."""
    x, y = global_batch(step)
    share = GLOBAL_BATCH // hvd.size()
    rows = slice(hvd.rank() * share, (hvd.rank() + 1) * share)
    return x[rows], y[rows]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def train(model, optimizer, steps, start=0, passes=1):
    for step in range(start, steps):
        optimizer.zero_grad()
        x, y = my_batch(step)
        for part in range(passes):  # `passes` backward passes, each on its share of the rows
            rows = slice(part * len(x) // passes, (part + 1) * len(x) // passes)
            (loss_of(model, x[rows], y[rows]) / passes).backward()
        optimizer.step()
    return flat(model)


def train_plainly(model, optimizer, steps, start=0):
    """One process, plain torch, on the whole batches: the independent reference."""
    for step in range(start, steps):
        optimizer.zero_grad()
        loss_of(model, *global_batch(step)).backward()
        optimizer.step()
    return flat(model)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def zero_optimizer(model, name, stage, **options):
    cls, defaults = OPTIMIZERS[name]
    return hvd.ZeroRedundancyOptimizer(groups_of(model), cls, shard_gradients=stage == 2,
                                       named_parameters=model.named_parameters(), **options, **defaults)


def state_bytes(state):
    return sum(value.numel() * value.element_size() for per_param in state.values()
               for value in per_param.values() if torch.is_tensor(value))


