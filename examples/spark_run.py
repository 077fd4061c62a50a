"""The ranks of one hvdplus job inside the tasks of a local Spark: each rank fits its shard of
scikit-learn's digits with softmax regression in numpy, hvdplus sums the gradients, and every
rank's test accuracy comes back to the driver.

    python examples/spark_run.py --num-proc 2
"""

import argparse
import os
import sys

from pyspark.sql import SparkSession

import hvdplus.spark


def train(steps, lr):
    """On each rank: full-batch gradient descent, the gradient summed over every rank's rows."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import hvdplus as hvd

    hvd.init()
    digits = load_digits()
    features = np.hstack([digits.data / 16.0, np.ones((len(digits.data), 1))])
    x_train, x_test, y_train, y_test = train_test_split(features, digits.target, test_size=0.25, random_state=0)
    x_mine, y_mine = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    weights = np.zeros((features.shape[1], 10))
    for _ in range(steps):
        logits = x_mine @ weights
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        probabilities[np.arange(len(y_mine)), y_mine] -= 1.0
        gradient = hvd.allreduce(x_mine.T @ probabilities, op=hvd.Sum, name="gradient") / len(x_train)
        weights -= lr * gradient
    return hvd.rank(), float(((x_test @ weights).argmax(axis=1) == y_test).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    # The tasks' Python is this one, which has hvdplus and scikit-learn.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{args.num_proc}]").appName("hvdplus spark_run")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for rank, accuracy in hvdplus.spark.run(train, args=(args.steps, args.lr), num_proc=args.num_proc):
        print(f"rank {rank}: test accuracy {accuracy:.4f}")
    spark.stop()


if __name__ == "__main__":
    main()
