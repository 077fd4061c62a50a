"""What elastic training costs: recovering from a dead rank, and committing the state.

    hvdplusrun -np 2 python benchmarks/elastic.py

Recovery: rank 0 starts, one after the other, 3-rank elastic jobs (`hvdplusrun -np 3
--min-np 2`) that train torch_training.py's deep MLP and commit every step; one rank
kills itself (SIGKILL) at step 20. The time from the kill to the first step the job
completes after it is measured in place (the survivors re-form the job) and by restart
(`--no-in-place`: the launcher starts the job again, which loads the commit from disk),
the median of `--repeats` jobs each; the other rank waits, idle, meanwhile.

Commit cost: in this job, the training throughput of the same MLP (batch 64 per rank)
without commits, committing a TorchState every 10 steps in memory (what elastic jobs do
where MPI lets the ranks outlive a dead one), and every 10 steps in memory and to disk
(where it does not, rank 0 writes each commit), measured in turns (harness.interleaved_throughputs),
with their ratios to no commits.

Writes benchmarks/results/elastic_np<ranks>.csv (see harness.write_results).
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import hvdplus.torch as hvd
from harness import (REPOSITORY, add_csv_option, interleaved_throughputs, print_throughput_rows, ratio,
                     throughput_rows, write_results)
from torch_training import deep_mlp, train_steps

BATCH = 64
KILL_STEP = 20
RECOVERY_STEPS = 40
COMMIT_EVERY = 10


# -- the recovery job (run by the launcher that rank 0 starts) ---------------------------
def recovery_job(out: str) -> None:
    """Train the MLP for RECOVERY_STEPS committed steps; rank 2 dies at KILL_STEP (once per
    job), writing when; rank 0 writes when the first step after it completed."""
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = deep_mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    data, target = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < RECOVERY_STEPS:
            if state.step == KILL_STEP and hvd.rank() == 2 and not os.path.exists(out + ".kill"):
                with open(out + ".kill", "w") as file:
                    file.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            train_steps(model, optimizer, data, target, 1)
            state.step += 1
            state.commit()
            if hvd.rank() == 0 and os.path.exists(out + ".kill") and not os.path.exists(out):
                with open(out, "w") as file:
                    file.write(repr(time.time()))

    train(state)


def recovery_seconds(in_place: bool) -> float:
    """Seconds from the kill to the first completed step, in one 3-rank elastic job."""
    with tempfile.TemporaryDirectory(prefix="hvdplus-elastic-bench-") as folder:
        out = os.path.join(folder, "first_step")
        # A launcher of its own: none of this job's MPI variables may reach it.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("OMPI_", "PMIX_", "PRTE_", "HVDPLUS_ELASTIC"))}
        command = [sys.executable, "-m", "hvdplus.runner", "-np", "3", "--min-np", "2",
                   *([] if in_place else ["--no-in-place"]),
                   sys.executable, os.path.abspath(__file__), "--recovery-job", out]
        job = subprocess.run(command, env=env, cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
        if job.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"recovery job failed (exit {job.returncode}):\n{job.stderr[-4000:]}")
        with open(out + ".kill") as killed, open(out) as first:
            return float(first.read()) - float(killed.read())


def measure_recovery(repeats: int) -> list:
    """Rows of recovery times, measured on rank 0 while the other ranks wait idle."""
    done = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(prefix="hvdplus-elastic-bench-"), "done"),
                                root_rank=0, name="recovery.done")
    rows = []
    if hvd.rank() == 0:
        for in_place in (True, False):
            times = [recovery_seconds(in_place) for _ in range(repeats)]
            rows.append({"measurement": "kill to first step", "path": "in place" if in_place else "restart",
                         "seconds": statistics.median(times), "runs": ";".join(f"{t:.3f}" for t in times)})
        open(done, "w").close()
    else:
        # Wait outside MPI, without spinning: the recovery jobs need both cores.
        while not os.path.exists(done):
            time.sleep(0.2)
    hvd.barrier()
    if hvd.rank() == 0:
        os.remove(done)
        os.rmdir(os.path.dirname(done))
    return rows


# -- commit cost, in this job -------------------------------------------------------------
def measure_commit_cost(steps: int) -> dict:
    torch.manual_seed(0)
    model = deep_mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    data, target = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))
    state = hvd.elastic.TorchState(model, optimizer)

    def committing(folder):
        def run(n):
            state.checkpoint_dir = folder
            for step in range(n):
                train_steps(model, optimizer, data, target, 1)
                if (step + 1) % COMMIT_EVERY == 0:
                    state.commit()
        return run

    with tempfile.TemporaryDirectory(prefix="hvdplus-commit-bench-") as disk:
        runs = {
            "no commits": (lambda n: train_steps(model, optimizer, data, target, n), hvd.size()),
            f"commit every {COMMIT_EVERY} steps": (committing(None), hvd.size()),
            f"commit every {COMMIT_EVERY} steps, to disk too": (committing(disk), hvd.size()),
        }
        return interleaved_throughputs(runs, BATCH, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recovery-job", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="recovery jobs per path")
    parser.add_argument("--steps", type=int, default=30, help="steps per run in each of 9 rounds")
    add_csv_option(parser)
    args = parser.parse_args()
    if args.recovery_job:
        recovery_job(args.recovery_job)
        return
    torch.set_num_threads(1)
    hvd.init()
    rows = measure_recovery(args.repeats)
    results = measure_commit_cost(args.steps)
    commit_rows = throughput_rows(results, [
        ratio(results, f"commit every {COMMIT_EVERY} steps", "no commits"),
        ratio(results, f"commit every {COMMIT_EVERY} steps, to disk too", "no commits"),
    ], model="mlp", batch_per_rank=BATCH, steps=args.steps)
    if hvd.rank() == 0:
        print("\nrecovery of a 3-rank job from a rank killed at step "
              f"{KILL_STEP}, kill to first completed step (median of {args.repeats}):")
        for row in rows:
            print(f"  {row['path']:9s} {row['seconds']:6.2f} s   (runs: {row['runs']} s)")
        print(f"\ncommitting a TorchState of the deep MLP, {hvd.size()} ranks, samples/s of all ranks together")
        print_throughput_rows(commit_rows)
    write_results("elastic", rows + commit_rows, {"torch": torch.__version__}, args.csv)


if __name__ == "__main__":
    main()
