"""Where the Spark estimators keep a run's data and checkpoints: a `Store`.

    store = LocalStore("/shared/hvdplus")          # or a path every Spark task can read
    estimator = TorchEstimator(store=store, ...)

A run (one `fit`, or several under one `run_id`) keeps under `<prefix>/runs/<run_id>/`:
- `train_data/` and `val_data/`: the DataFrame as Parquet, which the ranks read with pyarrow;
- `initial_model`: the model to train, which the ranks read here rather than take as an
  argument (the arguments of `hvdplus.spark.run` are limited in size);
- `checkpoint`: the model and optimizer after the last finished epoch, in the framework's own
  format, which a later fit under the same `run_id` resumes from.

`LocalStore` is a local or shared file system; the interface (paths for Spark to write and
pyarrow to read, and whole files as bytes) leaves room for HDFS or S3 stores.
"""

import os
from typing import Optional

__all__ = ["Store", "LocalStore"]


class Store:
    """The paths and files of estimator runs under one prefix.

    Args:
        prefix_path: where every run lives.
    """

    def __init__(self, prefix_path: str):
        self.prefix_path = prefix_path

    def run_path(self, run_id: str) -> str:
        return os.path.join(self.prefix_path, "runs", run_id)

    def train_data_path(self, run_id: str) -> str:
        return os.path.join(self.run_path(run_id), "train_data")

    def val_data_path(self, run_id: str) -> str:
        return os.path.join(self.run_path(run_id), "val_data")

    def initial_model_path(self, run_id: str) -> str:
        return os.path.join(self.run_path(run_id), "initial_model")

    def checkpoint_path(self, run_id: str) -> str:
        return os.path.join(self.run_path(run_id), "checkpoint")

    def spark_path(self, path: str) -> str:
        """`path` as Spark's writers name it."""
        return path

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def read(self, path: str) -> Optional[bytes]:
        """The whole file at `path`, or None when there is none."""
        raise NotImplementedError

    def write(self, path: str, data: bytes) -> None:
        """`data` as the file at `path`, whole or not at all."""
        raise NotImplementedError


class LocalStore(Store):
    """A store on a file system that the driver and every Spark task see at the same path
    (one machine, or a shared mount)."""

    def __init__(self, prefix_path: str):
        super().__init__(os.path.abspath(prefix_path))

    def spark_path(self, path: str) -> str:
        return "file://" + path

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read(self, path: str) -> Optional[bytes]:
        try:
            with open(path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    def write(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".partial", "wb") as file:
            file.write(data)
        os.replace(path + ".partial", path)
