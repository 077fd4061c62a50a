"""Data-parallel training of a small CNN on scikit-learn's bundled digits with hvdplus.torch.

    hvdplusrun -np 2 python examples/pytorch_digits.py --checkpoint checkpoints/digits.pt

Every rank trains on its own part of each epoch (DistributedSampler), DistributedOptimizer
averages the gradients across ranks, and the test metrics are summed over every rank's shard
of the test set. Rank 0 alone shows the progress bar, prints and writes the checkpoint.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

import hvdplus.torch as hvd


class DigitsNet(nn.Module):
    """Two 3x3 convolutions on the 8x8 image, one pooling step, two fully connected layers."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, images):
        x = F.relu(self.conv1(images))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step on each rank")
    parser.add_argument("--lr", type=float, default=0.002, help="Adam's learning rate for one rank; scaled by size()")
    parser.add_argument("--seed", type=int, default=42, help="seed of the split, the shuffling and the model")
    parser.add_argument("--checkpoint", default=None, help="path rank 0 saves model and optimizer to (none: no file)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="torch threads per rank (default: $OMP_NUM_THREADS, else 1)")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    return args


def digits_datasets(seed):
    """The 1797 digits as 1x8x8 float images in [0, 1], split 75/25 the same way on every rank."""
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, random_state=seed, stratify=labels
    )
    return TensorDataset(train_x, train_y), TensorDataset(test_x, test_y)


def train_epoch(model, optimizer, loader, progress):
    """One pass over this rank's part of the epoch; returns (summed loss, rows) of this rank."""
    model.train()
    loss_sum, rows = 0.0, 0
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        rows += len(labels)
        progress.set_postfix(loss=f"{loss.item():.4f}")
        progress.update(1)
    return loss_sum, rows


def evaluate(model, loader, name):
    """Test loss and accuracy over all ranks' shards: sums are all-reduced, then divided."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # summed loss, correct predictions, rows
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images)
            totals[0] += F.cross_entropy(logits, labels, reduction="sum").item()
            totals[1] += (logits.argmax(dim=1) == labels).sum().item()
            totals[2] += len(labels)
    loss_sum, correct, rows = hvd.allreduce(totals, op=hvd.Sum, name=name).tolist()
    return loss_sum / rows, correct / rows


def save_checkpoint(path, epoch, model, optimizer):
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.num_threads or int(os.environ.get("OMP_NUM_THREADS", 1)))
    torch.manual_seed(args.seed)
    is_root = hvd.rank() == 0

    train_set, test_set = digits_datasets(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    # Every size()-th test row, not a DistributedSampler: it would pad the shards with
    # repeated rows to equal length, and the repeats would count twice in the metrics.
    test_shard = Subset(test_set, range(hvd.rank(), len(test_set), hvd.size()))
    test_loader = DataLoader(test_shard, batch_size=256)

    model = DigitsNet()
    # Each rank's batch is args.batch_size rows, so a step sees size() times as many: scale lr.
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if is_root:
        print(f"ranks {hvd.size()}  train rows {len(train_set)}  test rows {len(test_set)}  "
              f"lr {args.lr * hvd.size():g}", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        with tqdm(total=len(train_loader), desc=f"epoch {epoch + 1}/{args.epochs}", disable=not is_root,
                  leave=False) as progress:
            loss_sum, rows = train_epoch(model, optimizer, train_loader, progress)
        train_totals = hvd.allreduce(torch.tensor([loss_sum, rows], dtype=torch.float64), op=hvd.Sum,
                                     name="train_totals")
        test_loss, test_accuracy = evaluate(model, test_loader, name="test_totals")
        if is_root:
            print(f"epoch {epoch + 1}  train loss {train_totals[0] / train_totals[1]:.4f}  "
                  f"test loss {test_loss:.4f}  test accuracy {test_accuracy:.4f}", flush=True)
            if args.checkpoint:
                save_checkpoint(args.checkpoint, epoch + 1, model, optimizer)

    if is_root:
        if args.checkpoint:
            print(f"checkpoint written to {args.checkpoint}")
        print(f"final test accuracy {test_accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
