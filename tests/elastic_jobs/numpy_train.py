"""An elastic job in numpy alone, for the fault matrix (tests/test_elastic_faults.py): the
linear model of replay.py, trained with SGD and momentum through hvdplus's numpy API and
hvdplus.elastic.run, its whole state one ObjectState. Needs no framework, so it runs on
MPICH's test environment too.

    numpy_train.py OUT [--kill RANK:STEP:PHASE ...] [--grow FILE:STEP:SLOTS] [--epochs E] [--step-seconds S]

Each step deals what is left of the epoch round-robin over the ranks, BATCH samples each,
and commits (epoch, size, every rank's sample ids) to the state's log, which the test checks
and replays with numpy. Rank 0 of the job appends the number of each step it starts to
OUT.starts, so the test can count the steps done again; every process writes an empty file
named by its process id into OUT.pids/, so the test can check that none is left running.

A rank named by --kill dies (SIGKILL) once per job (a marker file next to OUT remembers it
across restarts), at committed step STEP, in PHASE:
  step        before its forward pass;
  backward    with the all-reduce of its first gradient in flight;
  commit      inside state.commit, after saving;
  sync        inside a sync after an in-place re-form;
  first-sync  inside the first sync of a launch that restarted the job (STEP is not checked);
  reset       inside a reset callback;
  end         after the last commit.
With --grow, rank 0 writes "localhost:SLOTS" to FILE (which the launcher's host discovery
reads) at step STEP.
"""

import argparse
import os
import time

import numpy as np

import hvdplus as hvd
from kills import Kills
import replay
from replay import FEATURES, SAMPLES, dataset

BATCH = 4
LR, MOMENTUM = 0.05, 0.9


def remaining(state):
    """The samples of the epoch not yet committed, in the epoch's order."""
    order = np.random.default_rng(11 + state.epoch).permutation(SAMPLES).tolist()
    done = set(state.done)
    return [i for i in order if i not in done]


def gradient(x, y, weight, bias, ids):
    error = x[ids] @ weight + bias - y[ids]
    return 2 * error @ x[ids] / len(ids), np.array(2 * error.mean())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--grow", metavar="FILE:STEP:SLOTS")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in each step")
    args = parser.parse_args()
    # Whether this process belongs to a launch that restarted the job: rank 0 of the first
    # launch marks the job as started once every rank has synced, so after each rank looked.
    restarted = os.path.exists(args.out + ".started")
    hvd.init()
    os.makedirs(args.out + ".pids", exist_ok=True)
    open(os.path.join(args.out + ".pids", str(os.getpid())), "w").close()
    kills = Kills(args.kill, args.out)
    x, y = dataset()
    state = hvd.elastic.ObjectState(weight=np.linspace(-0.2, 0.2, FEATURES), bias=np.array(0.0),
                                    velocity=np.zeros(FEATURES + 1), epoch=0, done=[], log=[])
    resets = []  # the job's size after each re-form this process saw

    def on_reset():
        resets.append(hvd.size())
        kills.maybe(len(state.log), "reset")

    state.register_reset_callbacks([on_reset])
    original_save, original_sync = state.save, state.sync
    synced = []

    def save():
        original_save()
        kills.maybe(len(state.log), "commit")

    def sync():
        if synced:
            kills.maybe(len(state.log), "sync")
        elif restarted:
            kills.maybe(0, "first-sync")
        synced.append(True)
        original_sync()
        if hvd.rank() == 0 and not os.path.exists(args.out + ".started"):
            open(args.out + ".started", "w").close()

    state.save, state.sync = save, sync

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            left = remaining(state)
            if not left:
                state.epoch, state.done = state.epoch + 1, []
                state.commit()
                continue
            step = len(state.log)
            if hvd.rank() == 0:
                with open(args.out + ".starts", "a") as starts:
                    starts.write(f"{step}\n")
            if args.grow and hvd.rank() == 0 and step == int(args.grow.split(":")[1]):
                path, _, slots = args.grow.split(":")
                with open(path, "w") as file:
                    file.write(f"localhost:{slots}\n")
            kills.maybe(step, "step")
            time.sleep(args.step_seconds)
            batches = [left[rank::hvd.size()][:BATCH] for rank in range(hvd.size())]
            grad_weight, grad_bias = gradient(x, y, state.weight, state.bias, batches[hvd.rank()])
            in_flight = hvd.allreduce_async(grad_weight, op=hvd.Average, name="grad.weight")
            kills.maybe(step, "backward")
            grad = np.concatenate([hvd.synchronize(in_flight),
                                   [hvd.allreduce(grad_bias, op=hvd.Average, name="grad.bias")]])
            state.velocity = MOMENTUM * state.velocity + grad if state.log else grad
            state.weight = state.weight - LR * state.velocity[:FEATURES]
            state.bias = state.bias - LR * state.velocity[FEATURES]
            state.done = state.done + [i for batch in batches for i in batch]
            state.log.append((state.epoch, hvd.size(), batches))
            state.commit()

    train(state)
    kills.maybe(len(state.log), "end")
    replay.save(args.out, state.log, resets, state.weight, state.bias)


if __name__ == "__main__":
    main()
