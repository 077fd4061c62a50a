"""How long a 2-rank job takes to start on a local Spark, by `hvdplus.spark.run` beside
`hvdplusrun` and pyspark's `TorchDistributor`; and what a `TorchEstimator` fit costs against the
same training on arrays.

    python benchmarks/spark.py [--repeats 5]

A driver starts a local Spark (`local[2]`, not timed) and times, in turns:
- start-up: jobs that only join the job and return: `hvdplus.spark.run(fn, num_proc=2)` (ranks in
  the tasks of a barrier stage, `hvd.init()`), `hvdplusrun -np 2 python -c ...` as a subprocess,
  and `TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)` (torchrun in
  the tasks of a barrier stage, `init_process_group("gloo")`). The median wall time from the call
  to its return, the ranks' interpreter start-up included.
- the estimator: `TorchEstimator(num_proc=2, epochs=EPOCHS).fit(df)` on scikit-learn's digits
  (1,347 rows), from the DataFrame (the Parquet write included), against
  `hvdplus.spark.run` of the same training loop on numpy arrays the driver holds. Each epoch's
  seconds come from the ranks: the median over the epochs after the first.

Writes benchmarks/results/spark_np2.csv (see harness.write_table).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import mpi4py

mpi4py.rc.initialize = False  # this driver only starts jobs; MPI runs in them

import numpy as np  # noqa: E402
import torch  # noqa: E402
from pyspark.ml.torch.distributor import TorchDistributor  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import hvdplus.spark  # noqa: E402
from harness import REPOSITORY, median_rows, write_driver_table  # noqa: E402
from hvdplus.spark.store import LocalStore  # noqa: E402
from hvdplus.spark.torch import TorchEstimator  # noqa: E402

EPOCHS = 6
BATCH = 32


def join_and_return():
    import hvdplus as hvd
    hvd.init()
    return hvd.rank()


def torch_join_and_return():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank


def timed(start) -> float:
    began = time.perf_counter()
    start()
    return time.perf_counter() - began


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def train_on_arrays(make_net, x, y, epochs, batch):
    """The estimator's loop on arrays each rank slices for itself: the seconds of each epoch."""
    import time

    import torch

    import hvdplus.torch as hvd
    hvd.init()
    model = make_net()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.from_numpy(x[hvd.rank()::hvd.size()]), torch.from_numpy(y[hvd.rank()::hvd.size()])
    steps = int(hvd.allreduce(torch.tensor([len(x) // batch]), op=hvd.Min)[0])
    seconds = []
    for _ in range(epochs):
        began = time.perf_counter()
        order = torch.randperm(len(x))
        for step in range(steps):
            rows = order[step * batch:(step + 1) * batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
        seconds.append(time.perf_counter() - began)
    return seconds


def estimator_fit(spark, frame, store_path):
    model = net()
    estimator = TorchEstimator(num_proc=2, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
                               loss=torch.nn.functional.cross_entropy, store=LocalStore(store_path),
                               feature_cols=["features"], label_cols=["label"], batch_size=BATCH, epochs=EPOCHS,
                               verbose=0)
    began = time.perf_counter()
    fitted = estimator.fit(frame)
    return time.perf_counter() - began, [metrics["seconds"] for metrics in fitted.getHistory()]


def arrays_fit(x, y):
    began = time.perf_counter()
    seconds = hvdplus.spark.run(train_on_arrays, args=(net, x, y, EPOCHS, BATCH), num_proc=2)[0]
    return time.perf_counter() - began, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/spark_np2.csv")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    starts = {
        "hvdplus.spark.run": lambda: hvdplus.spark.run(join_and_return, num_proc=2, verbose=0),
        "hvdplusrun": lambda: subprocess.run(
            [sys.executable, "-m", "hvdplus.runner", "-np", "2", sys.executable, "-c",
             "import hvdplus; hvdplus.init(); hvdplus.shutdown()"], cwd=REPOSITORY, check=True, capture_output=True),
        "TorchDistributor (local_mode=False)": lambda: TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False).run(torch_join_and_return),
    }
    seconds = {way: [] for way in starts}
    for _ in range(args.repeats):
        for way, start in starts.items():
            seconds[way].append(timed(start))
    rows = median_rows(seconds, measurement="start-up")

    from sklearn.datasets import load_digits
    digits = load_digits()
    train = np.arange(len(digits.target)) % 4 != 0
    x, y = (digits.data[train] / 16.0).astype(np.float32), digits.target[train].astype(np.int64)
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<double>, label long")
    fits = {"TorchEstimator.fit(df)": [], "hvdplus.spark.run on arrays": []}
    epochs = {way: [] for way in fits}
    for _ in range(max(1, args.repeats // 2)):
        with tempfile.TemporaryDirectory(prefix="hvdplus-store-") as store:
            for way, fit in (("TorchEstimator.fit(df)", lambda: estimator_fit(spark, frame, store)),
                             ("hvdplus.spark.run on arrays", lambda: arrays_fit(x, y))):
                total, each = fit()
                fits[way].append(total)
                epochs[way] += each[1:]
    rows += median_rows(fits, measurement=f"fit of {EPOCHS} epochs")
    rows += median_rows(epochs, decimals=4, measurement="epoch (after the first)")
    spark.stop()
    write_driver_table("spark", rows, args.csv, "python benchmarks/spark.py")


if __name__ == "__main__":
    main()
