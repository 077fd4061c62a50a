"""Fit a Keras MLP to scikit-learn's digits held in a Spark DataFrame, with hvdplus's KerasEstimator:
the DataFrame goes to a store as Parquet, the ranks train on their shares of it inside Spark tasks
with `model.fit`, and the fitted Spark ML model adds its predictions to a test DataFrame.

    python examples/spark_keras_estimator.py --num-proc 2 --epochs 10 --backend torch

--backend picks the ranks' Keras backend (tensorflow, torch or jax). Run it again with the same
--store and --run-id and more --epochs: it goes on from the store's last checkpoint.
"""

import argparse
import os
import sys
import tempfile

import keras
import numpy as np
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from hvdplus.spark.keras import KerasEstimator
from hvdplus.spark.store import LocalStore


def digits_frames(spark):
    """(train, test) DataFrames of pixels (64 in 0..1) and digit; every fourth row for testing."""
    digits = load_digits()
    test = np.arange(len(digits.target)) % 4 == 0
    rows = [((pixels / 16.0).tolist(), int(digit), bool(held)) for pixels, digit, held in
            zip(digits.data, digits.target, test)]
    frame = spark.createDataFrame(rows, "features array<double>, label long, test boolean")
    return frame.filter(~frame.test).drop("test"), frame.filter(frame.test).drop("test")


def digits_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--backend", default=None, help="the ranks' Keras backend (default: this process's)")
    parser.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "hvdplus-store"))
    parser.add_argument("--run-id", default=None, help="a run of the store to go on with (default: a new one)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{args.num_proc}]").appName("hvdplus KerasEstimator")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    train, test = digits_frames(spark)

    estimator = KerasEstimator(num_proc=args.num_proc, model=digits_model(), optimizer=keras.optimizers.Adam(args.lr),
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                               metrics=["accuracy"], store=LocalStore(args.store), feature_cols=["features"],
                               label_cols=["label"], batch_size=args.batch_size, epochs=args.epochs,
                               validation=0.1, run_id=args.run_id, backend=args.backend)
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
