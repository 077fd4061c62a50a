"""Data-parallel softmax regression on scikit-learn's bundled digits, in plain numpy.

    hvdplusrun -np 2 python examples/numpy_logistic_regression.py

Each rank computes gradients on its own shard of the training set; hvdplus sums them
across ranks, so every step equals a full-batch step of a single process, whatever -np is.
"""

import argparse

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdplus as hvd


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def local_loss_and_gradient(weights, features, labels):
    """Summed (not averaged) loss and gradient over this rank's rows."""
    probabilities = softmax(features @ weights)
    loss = -np.log(probabilities[np.arange(len(labels)), labels] + 1e-12).sum()
    probabilities[np.arange(len(labels)), labels] -= 1.0
    return loss, features.T @ probabilities


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    hvd.init()
    digits = load_digits()
    features = np.hstack([digits.data / 16.0, np.ones((len(digits.data), 1))])
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.25, random_state=0
    )
    # Every rank takes every size()-th row: shards differ by at most one row.
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    total_rows = hvd.allreduce(np.array(len(y_shard)), op=hvd.Sum, name="rows")

    # Ranks start from different random weights; rank 0's are broadcast so all agree.
    weights = np.random.default_rng(hvd.rank()).normal(0, 0.01, (features.shape[1], 10))
    weights = hvd.broadcast(weights, root_rank=0, name="initial_weights")

    for step in range(args.steps):
        loss, gradient = local_loss_and_gradient(weights, x_shard, y_shard)
        sums = hvd.allreduce(np.append(gradient.ravel(), loss), op=hvd.Sum, name="gradient")
        weights -= args.lr * sums[:-1].reshape(weights.shape) / total_rows
        if hvd.rank() == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {sums[-1] / total_rows:.6f}", flush=True)

    accuracy = (np.argmax(x_test @ weights, axis=1) == y_test).mean()
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}  final loss {sums[-1] / total_rows:.8f}  test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
