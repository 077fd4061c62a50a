"""For tests/test_slurm.py and tests/test_stop_signals.py: linear regression in numpy
through `hvd.elastic.run`, a commit after every step, that logs each step it runs.

Each step k, rank r of a job of n ranks computes the mean-squared-error gradient of its own
batch (a function of k and r alone), and the ranks average them. Every rank appends
"ran <k> <n> <time>" to its own file in --log-dir once the step's all-reduce is done, and "committed <k>"
once the commit is made, so that a test can tell steps that ran twice (work lost) and replay
the training in numpy, step by step, with each step's size. At the end rank 0 prints
{"weights": [...], "steps": N}. --ready-file is created once the first step is done;
--raise-at-step K makes rank --raise-rank raise there.
"""

import argparse
import json
import os
import socket
import time

import numpy as np

import hvdplus as hvd

FEATURES = 4
LEARNING_RATE = 0.05


def batch(step, rank):
    """Rank `rank`'s (features, targets) at `step`."""
    generator = np.random.default_rng(1000 * step + rank)
    features = generator.normal(size=(8, FEATURES))
    targets = features @ np.arange(1.0, FEATURES + 1) + 0.1 * rank
    return features, targets


def gradient(weights, step, rank):
    features, targets = batch(step, rank)
    return 2 * features.T @ (features @ weights - targets) / len(targets)


def replay(sizes):
    """The weights after the steps whose job sizes are `sizes`, in one process."""
    weights = np.zeros(FEATURES)
    for step, size in enumerate(sizes):
        weights = weights - LEARNING_RATE * np.mean([gradient(weights, step, rank) for rank in range(size)], axis=0)
    return weights


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--ready-file")
    parser.add_argument("--raise-at-step", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=1)
    args = parser.parse_args()

    hvd.init()
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"{socket.gethostname()}.{os.getpid()}.log"), "a", buffering=1)
    state = hvd.elastic.ObjectState(weights=np.zeros(FEATURES), step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            if state.step == args.raise_at_step and hvd.rank() == args.raise_rank:
                log.write(f"raising {time.time():.3f}\n")
                raise ValueError(f"rank {hvd.rank()} refuses step {state.step}")
            mine = gradient(state.weights, state.step, hvd.rank())
            averaged = hvd.allreduce(mine, name="gradient")
            log.write(f"ran {state.step} {hvd.size()} {time.time():.3f}\n")
            state.weights = state.weights - LEARNING_RATE * averaged
            state.step += 1
            time.sleep(args.step_seconds)
            state.commit()
            log.write(f"committed {state.step - 1}\n")
            if args.ready_file and state.step == 1 and hvd.rank() == 0:
                open(args.ready_file, "w").close()

    train(state)
    if hvd.rank() == 0:
        print(json.dumps({"weights": state.weights.tolist(), "steps": state.step}), flush=True)


if __name__ == "__main__":
    main()
