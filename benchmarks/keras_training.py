"""Keras model.fit throughput with hvdplus against the same ranks without communication.

    KERAS_BACKEND=torch      hvdplusrun -np 2 python benchmarks/keras_training.py
    KERAS_BACKEND=tensorflow hvdplusrun -np 2 python benchmarks/keras_training.py

In one job and one thread per rank: model.fit with hvdplus' DistributedOptimizer on every
rank, the same ranks fitting their own copies with no communication ("independent
ranks"), and one rank alone, taking turns round after round
(harness.interleaved_throughputs). Scaling efficiency = hvdplus / independent ranks. Timed
in steady state, between batch ends inside each fit (see fit_run).
"""

import argparse
import os

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdplus.keras as hvd  # noqa: E402
from harness import fit_runner, interleaved_throughputs  # noqa: E402

WORLD = MPI.COMM_WORLD


def build_model(width=256, depth=8):
    layers = [keras.Input((width,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def fit_run(model, x, y, batch, participants):
    """(run, participants) for harness.interleaved_throughputs: fits timed in steady state
    (see harness.fit_runner)."""
    fit = fit_runner(model, x, y, batch)

    def run(n):
        if participants == 1 and hvd.rank() != 0:
            return 0.0, 1  # not taking part: the slowest rank's time is the participant's
        return fit(n)

    return run, participants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60, help="steps per fit in each round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds in which the runs take turns")
    args = parser.parse_args()
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    rows = args.batch_size * args.steps
    x = rng.normal(size=(rows, 256)).astype("float32")
    y = rng.integers(0, 10, rows)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    model = build_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss=loss)
    alone = build_model()
    alone.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
    results = interleaved_throughputs({
        "hvdplus": fit_run(model, x, y, args.batch_size, hvd.size()),
        "independent ranks": fit_run(alone, x, y, args.batch_size, hvd.size()),
        "one rank alone": fit_run(alone, x, y, args.batch_size, 1),
    }, args.batch_size, args.steps, rounds=args.rounds)
    if hvd.rank() == 0:
        print(f"Keras {keras.__version__}, backend {keras.backend.backend()}, {hvd.size()} ranks, "
              f"MLP 8 x 256, batch {args.batch_size} per rank; samples/s of all ranks together")
        for label, value in results.items():
            print(f"  {label:18s} {value:10.1f}")
        print(f"  scaling efficiency (hvdplus / independent ranks): "
              f"{results['hvdplus'] / results['independent ranks']:.3f}")


if __name__ == "__main__":
    main()
