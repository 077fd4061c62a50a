"""Pipeline and data parallelism together: 2 pipeline stages x 2 data-parallel replicas of
an MLP on scikit-learn's bundled digits, with hvdplus.torch.

    hvdplusrun -np 4 python examples/pytorch_hybrid_parallel.py

Rank r runs stage r % 2 of replica r // 2:

    replica 0:  rank 0 (stage 0) -> rank 1 (stage 1)
    replica 1:  rank 2 (stage 0) -> rank 3 (stage 1)

Each replica's pipeline (a process set of its two ranks) trains on half of every global
batch, split into micro-batches (1F1B schedule); each stage's gradients are averaged over
the two replicas of that stage (a process set of ranks 0 and 2, or 1 and 3) by a
DistributedOptimizer. Rank 0 prints the loss and test accuracy, which the last stages
compute, after each epoch.
"""

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdplus.torch as hvd
from hvdplus.torch.pipeline import Pipeline, split_sequential

STAGES = 2


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="rows of a global batch (all replicas)")
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches per replica and step")
    parser.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    parser.add_argument("--lr", type=float, default=0.01)
    return parser.parse_args()


def digits(seed=42):
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def mlp():
    torch.manual_seed(0)  # the same initial model on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
    )


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    if hvd.size() % STAGES:
        raise SystemExit(f"this example needs a multiple of {STAGES} ranks, got {hvd.size()}")
    replicas = hvd.size() // STAGES
    stage, replica = hvd.rank() % STAGES, hvd.rank() // STAGES
    # Every rank adds every set, in the same order.
    pipelines = [hvd.add_process_set([r * STAGES + s for s in range(STAGES)]) for r in range(replicas)]
    stage_replicas = [hvd.add_process_set([r * STAGES + s for r in range(replicas)]) for s in range(STAGES)] \
        if replicas > 1 else [hvd.global_process_set] * STAGES

    pipe = Pipeline(split_sequential(mlp(), STAGES), process_set=pipelines[replica], chunks=args.chunks,
                    schedule=args.schedule, loss_fn=F.cross_entropy)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(pipe.module.parameters(), lr=args.lr),
        named_parameters=pipe.module.named_parameters(), process_set=stage_replicas[stage],
        backward_passes_per_step=args.chunks)

    train_x, test_x, train_y, test_y = digits()
    share = args.batch_size // replicas
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        loss_sum, steps = 0.0, 0
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            rows = order[start + replica * share:start + (replica + 1) * share]
            optimizer.zero_grad()
            loss = pipe.train_step(train_x[rows] if pipe.is_first else None, train_y[rows] if pipe.is_last else None)
            optimizer.step()
            loss_sum += loss.item() if loss is not None else 0.0
            steps += 1
        logits = pipe.evaluate(test_x if pipe.is_first else None)
        correct = float((logits.argmax(1) == test_y).sum()) if logits is not None else 0.0
        # The last stages hold the numbers: sum them over the job, so rank 0 can print them.
        totals = hvd.allreduce(torch.tensor([loss_sum / steps, correct]), op=hvd.Sum, name="epoch metrics")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {totals[0].item() / replicas:.4f}, "
                  f"test accuracy {totals[1].item() / replicas / len(test_y):.4f}", flush=True)


if __name__ == "__main__":
    main()
