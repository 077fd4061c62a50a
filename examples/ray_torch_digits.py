"""Data-parallel training of a small MLP on scikit-learn's bundled digits, with Ray Train and hvdplus.

    python examples/ray_torch_digits.py --num-workers 2

Ray Train starts the workers and runs `train_loop` in each; `HvdplusConfig` makes them the ranks
of one hvdplus job, so `hvd.init()` there joins it. Every worker trains on its own part of each
epoch (DistributedSampler), DistributedOptimizer averages the gradients, and the test metrics are
summed over every worker's shard of the test set. Each epoch every worker reports the metrics to
Ray Train, rank 0 with a checkpoint, and the driver prints them once the run is over; a run
started again under the same name (--name) goes on from its last checkpoint.
"""

import argparse
import os
import tempfile

import ray
import ray.train
import torch
import torch.nn.functional as F
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hvdplus.ray import HvdplusConfig


class DigitsMLP(nn.Module):
    """The 8x8 image as 64 inputs, two hidden layers of 64 units."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                    nn.Linear(64, num_classes))

    def forward(self, images):
        return self.layers(images)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2, help="Ray Train workers, one rank each")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step on each worker")
    parser.add_argument("--lr", type=float, default=0.002, help="Adam's learning rate for one worker; scaled by size()")
    parser.add_argument("--seed", type=int, default=42, help="seed of the split, the shuffling and the model")
    parser.add_argument("--name", default=None, help="the run's name (default: a new one); resumes a run of that name")
    parser.add_argument("--storage-path", default=None, help="where Ray Train keeps checkpoints (default: Ray's)")
    args = parser.parse_args()
    if args.epochs < 1 or args.num_workers < 1:
        parser.error("--epochs and --num-workers must be at least 1")
    return args


def digits_datasets(seed):
    """The 1797 digits as 64 floats in [0, 1], split 75/25 the same way on every worker."""
    digits = load_digits()
    images = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, random_state=seed, stratify=labels
    )
    return TensorDataset(train_x, train_y), TensorDataset(test_x, test_y)


def train_epoch(model, optimizer, loader):
    """One pass over this worker's part of the epoch; returns (summed loss, rows) of this worker."""
    model.train()
    loss_sum, rows = 0.0, 0
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        rows += len(labels)
    return loss_sum, rows


def evaluate(model, loader, hvd):
    """Test accuracy over all workers' shards: the sums are all-reduced, then divided."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64)  # correct predictions, rows
    with torch.no_grad():
        for images, labels in loader:
            totals[0] += (model(images).argmax(dim=1) == labels).sum().item()
            totals[1] += len(labels)
    correct, rows = hvd.allreduce(totals, op=hvd.Sum, name="test_totals").tolist()
    return correct / rows


def restore(model, optimizer, hvd):
    """The epochs the run's last checkpoint had done (0 without one); rank 0 reads the
    checkpoint and broadcasts the model and the optimizer's state to the others."""
    done = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None and hvd.rank() == 0:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        done = state["epoch"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.broadcast_object(done, root_rank=0)


def report(metrics, model, optimizer, hvd):
    """Every worker reports the metrics; rank 0 alone with a checkpoint, as Ray Train advises."""
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if hvd.rank() == 0:
            torch.save({"epoch": metrics["epoch"], "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(folder, "state.pt"))
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def train_loop(config):
    import hvdplus.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    train_set, test_set = digits_datasets(config["seed"])
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True,
                                 seed=config["seed"])
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], sampler=sampler)
    # Every size()-th test row: DistributedSampler would pad the shards with repeated rows.
    test_loader = DataLoader(Subset(test_set, range(hvd.rank(), len(test_set), hvd.size())), batch_size=256)

    model = DigitsMLP()
    # Each worker's batch is batch_size rows, so a step sees size() times as many: scale lr.
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"] * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for epoch in range(restore(model, optimizer, hvd), config["epochs"]):
        sampler.set_epoch(epoch)
        loss_sum, rows = train_epoch(model, optimizer, train_loader)
        train_totals = hvd.allreduce(torch.tensor([loss_sum, rows], dtype=torch.float64), op=hvd.Sum,
                                     name="train_totals")
        metrics = {"epoch": epoch + 1, "train_loss": (train_totals[0] / train_totals[1]).item(),
                   "test_accuracy": evaluate(model, test_loader, hvd)}
        report(metrics, model, optimizer, hvd)


def main():
    args = parse_args()
    # A local Ray with a CPU per worker; on a cluster, ray.init(address="auto") instead.
    ray.init(num_cpus=args.num_workers, include_dashboard=False)
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed},
        backend_config=HvdplusConfig(),
        scaling_config=ScalingConfig(num_workers=args.num_workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=args.name, storage_path=args.storage_path),
    )
    result = trainer.fit()
    # Every checkpoint the run kept, with the metrics reported beside it: one per epoch.
    for _, metrics in sorted(result.best_checkpoints, key=lambda pair: pair[1]["epoch"]):
        print(f"epoch {metrics['epoch']}  train loss {metrics['train_loss']:.4f}  "
              f"test accuracy {metrics['test_accuracy']:.4f}")
    print(f"last checkpoint {result.checkpoint.path}")
    print(f"final test accuracy {result.metrics['test_accuracy']:.4f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
