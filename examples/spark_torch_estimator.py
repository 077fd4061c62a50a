"""Fit a torch MLP to scikit-learn's digits held in a Spark DataFrame, with hvdplus's TorchEstimator:
the DataFrame goes to a store as Parquet, the ranks train on their shares of it inside Spark tasks,
and the fitted Spark ML model adds its predictions to a test DataFrame.

    python examples/spark_torch_estimator.py --num-proc 2 --epochs 10

Run it again with the same --store and --run-id and more --epochs: it goes on from the store's
last checkpoint.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from hvdplus.spark.store import LocalStore
from hvdplus.spark.torch import TorchEstimator


def digits_frames(spark):
    """(train, test) DataFrames of features (64 pixels in 0..1) and label; a quarter for testing."""
    digits = load_digits()
    rows = [((digits.data[i] / 16.0).tolist(), int(digits.target[i]), i % 4 == 0) for i in range(len(digits.target))]
    frame = spark.createDataFrame(rows, "features array<double>, label long, test boolean")
    return frame.filter(~frame.test).drop("test"), frame.filter(frame.test).drop("test")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "hvdplus-store"))
    parser.add_argument("--run-id", default=None, help="a run of the store to go on with (default: a new one)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{args.num_proc}]").appName("hvdplus TorchEstimator")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    train, test = digits_frames(spark)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    estimator = TorchEstimator(num_proc=args.num_proc, model=net, optimizer=optimizer,
                               loss=torch.nn.functional.cross_entropy, store=LocalStore(args.store),
                               feature_cols=["features"], label_cols=["label"], batch_size=args.batch_size,
                               epochs=args.epochs, validation=0.1, run_id=args.run_id)
    model = estimator.fit(train)
    for metrics in model.getHistory():
        print("epoch {epoch}: loss {loss:.4f}, validation loss {val_loss:.4f}, accuracy {val_accuracy:.4f}"
              .format(**metrics))
    predicted = model.transform(test).toPandas()
    accuracy = (np.stack(predicted["label__output"]).argmax(axis=1) == predicted["label"]).mean()
    print(f"run {model.getRunId()} in {args.store}")
    print(f"test accuracy {accuracy:.4f}")
    spark.stop()


if __name__ == "__main__":
    main()
