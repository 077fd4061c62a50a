"""What elastic training costs: recovering from a dead rank or a lost host, and committing.

    hvdplusrun -np 2 --min-np 2 python benchmarks/elastic.py [--lost-host]

This job is itself elastic (--min-np), so that its commits pay what they pay in any elastic
job: the per-commit check for added slots among them.

Recovery: rank 0 starts, one after the other, 3-rank elastic jobs (`hvdplusrun -np 3
--min-np 2`) that train torch_training.py's deep MLP and commit every step; at step 20 one
rank dies (SIGKILL). Measured: the seconds from the kill to the first step the job completes
after it, and the steps lost (steps started more than once), the median of `--repeats` jobs,
for each path: in place (the survivors re-form the job), restart (`--no-in-place`: the
launcher starts the job again, which resumes from the commit on disk), and with
`--lost-host`, a lost host: the same job across 3 podman containers (tests/testkit/cluster.py
builds them), whose third container is killed (`podman kill`); Open MPI then ends every rank
and the job resumes from the newest commit on the disks of the two containers left. The
other rank of this job waits, idle, meanwhile.

Commit cost: in this job, the training throughput of the same MLP (batch 64 per rank)
without commits, committing a TorchState every 10 steps in memory only, and every 10 steps in
memory and to disk (one rank per host writes each commit in the background: what elastic
jobs do where MPI lets the ranks outlive a dead one), measured in turns
(harness.interleaved_throughputs), with their ratios to no commits.

Writes benchmarks/results/elastic_np<ranks>.csv (see harness.write_results).
"""

import argparse
import os
import shutil
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
def recovery_job(out: str, kill: bool, step_seconds: float) -> None:
    """Train the MLP for RECOVERY_STEPS committed steps. Rank 0 appends "start STEP TIME" and
    "done STEP TIME" to OUT.steps for each step it starts and completes. With `kill`, rank 2
    dies at KILL_STEP (once per job: OUT.kill, which holds the time, remembers it); without,
    something else (a container killed) ends it."""
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = deep_mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    data, target = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    def note(what, step):
        if hvd.rank() == 0:
            with open(out + ".steps", "a") as steps:
                steps.write(f"{what} {step} {time.time()!r}\n")

    @hvd.elastic.run
    def train(state):
        while state.step < RECOVERY_STEPS:
            step = state.step
            note("start", step)
            if kill and state.step == KILL_STEP and hvd.rank() == 2 and not os.path.exists(out + ".kill"):
                with open(out + ".kill", "w") as file:
                    file.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            train_steps(model, optimizer, data, target, 1)
            time.sleep(step_seconds)
            state.step += 1
            state.commit()
            note("done", step)

    train(state)


def recovery_figures(steps_log: str, killed_at: float) -> tuple:
    """(seconds from `killed_at` to the first step completed that started after it, steps lost)
    from a recovery job's OUT.steps. A step that was under way at the kill may still complete
    on the old ranks (a container takes a moment to die): it does not count as recovered."""
    with open(steps_log) as file:
        lines = [(what, int(step), float(when)) for what, step, when in (line.split() for line in file if line.strip())]
    started = {}
    for what, step, when in lines:
        if what == "start":
            started[step] = when
        elif started[step] > killed_at:
            return when - killed_at, sum(1 for what, _, _ in lines if what == "start") - RECOVERY_STEPS
    raise RuntimeError(f"no step started after the kill completed: {steps_log}")


def job_command(ranks_args, out, kill, step_seconds=0.0, python=sys.executable, script=os.path.abspath(__file__)):
    return [python, "-m", "hvdplus.runner", "-np", "3", "--min-np", "2", *ranks_args, python, script,
            "--recovery-job", out, "--step-seconds", str(step_seconds), *([] if kill else ["--no-kill"])]


def recovery_on_this_machine(in_place: bool) -> tuple:
    """(seconds, steps lost) of one 3-rank elastic job on this machine."""
    with tempfile.TemporaryDirectory(prefix="hvdplus-elastic-bench-") as folder:
        out = os.path.join(folder, "job")
        # A launcher of its own: none of this job's MPI variables may reach it.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("OMPI_", "PMIX_", "PRTE_", "HVDPLUS_ELASTIC"))}
        command = job_command([] if in_place else ["--no-in-place"], out, kill=True)
        job = subprocess.run(command, env=env, cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
        if job.returncode != 0 or not os.path.exists(out + ".kill"):
            raise RuntimeError(f"recovery job failed (exit {job.returncode}):\n{job.stderr[-4000:]}")
        with open(out + ".kill") as killed:
            return recovery_figures(out + ".steps", float(killed.read()))


def recovery_after_a_lost_host(cluster) -> tuple:
    """(seconds, steps lost) of one 3-rank elastic job across 3 containers, the third killed
    at step KILL_STEP."""
    nodes = cluster.Cluster(3, tempfile.mkdtemp(prefix="hvdplus-elastic-bench-"),
                            mounts={os.path.join(REPOSITORY, "benchmarks"): "/bench"})
    try:
        out = "/home/hvd/job"
        command = job_command(["-H", nodes.hosts([1, 1, 1])], out, kill=False, step_seconds=0.05,
                              python="python", script="/bench/elastic.py")
        job = subprocess.Popen(["podman", "exec", "-u", "hvd", "-w", "/home/hvd", nodes.names[0], *command],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while f"start {KILL_STEP} " not in cluster.podman("exec", nodes.names[0], "cat", out + ".steps",
                                                          check=False).stdout:
            if job.poll() is not None or time.monotonic() > deadline:
                job.kill()
                raise RuntimeError("the job across containers never reached the step to kill at:\n"
                                   + job.stdout.read()[-4000:])
            time.sleep(0.05)
        killed_at = time.time()
        cluster.podman("kill", nodes.names[2])
        output, _ = job.communicate(timeout=300)
        if job.returncode != 0:
            raise RuntimeError(f"the job across containers failed (exit {job.returncode}):\n{output[-4000:]}")
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "steps")
            with open(log, "w") as file:
                file.write(cluster.podman("exec", nodes.names[0], "cat", out + ".steps").stdout)
            return recovery_figures(log, killed_at)
    finally:
        nodes.remove()
        shutil.rmtree(os.path.dirname(nodes.key), ignore_errors=True)


def container_cluster():
    """tests/testkit/cluster.py with its image built; None (and why, printed) where podman is absent."""
    sys.path.insert(0, os.path.join(REPOSITORY, "tests"))
    from testkit import cluster
    reason = cluster.unavailable_reason()
    if reason:
        print(f"no lost-host measurement: {reason}", flush=True)
        return None
    cluster.build_image()
    return cluster


def measure_recovery(repeats: int, lost_host: bool) -> list:
    """Rows of recovery figures, measured on rank 0 while the other ranks wait idle."""
    done = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(prefix="hvdplus-elastic-bench-"), "done"),
                                root_rank=0, name="recovery.done")
    rows = []
    if hvd.rank() == 0:
        paths = {"in place": lambda: recovery_on_this_machine(True),
                 "restart": lambda: recovery_on_this_machine(False)}
        cluster = container_cluster() if lost_host else None
        if cluster is not None:
            paths["lost host, restart"] = lambda: recovery_after_a_lost_host(cluster)
        for path, measure in paths.items():
            figures = [measure() for _ in range(repeats)]
            seconds, lost = [f[0] for f in figures], [f[1] for f in figures]
            rows.append({"measurement": "kill to first step", "path": path, "seconds": statistics.median(seconds),
                         "runs": ";".join(f"{t:.3f}" for t in seconds), "steps_lost": statistics.median(lost)})
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
    in_memory = hvd.elastic.TorchState(model, optimizer)
    in_memory.disk_commits = None
    to_disk = hvd.elastic.TorchState(model, optimizer)
    if to_disk.disk_commits is None:
        raise SystemExit("run this benchmark as an elastic job: hvdplusrun -np 2 --min-np 2 python "
                         "benchmarks/elastic.py")

    def committing(state):
        def run(n):
            for step in range(n):
                train_steps(model, optimizer, data, target, 1)
                if (step + 1) % COMMIT_EVERY == 0:
                    state.commit()
            if state.disk_commits is not None:
                state.disk_commits.wait()  # a run's writes are its own cost
        return run

    runs = {
        "no commits": (lambda n: train_steps(model, optimizer, data, target, n), hvd.size()),
        f"commit every {COMMIT_EVERY} steps, in memory": (committing(in_memory), hvd.size()),
        f"commit every {COMMIT_EVERY} steps, to disk in the background": (committing(to_disk), hvd.size()),
    }
    return interleaved_throughputs(runs, BATCH, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recovery-job", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--no-kill", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="recovery jobs per path")
    parser.add_argument("--lost-host", action="store_true",
                        help="also measure the recovery from a lost host, across podman containers")
    parser.add_argument("--steps", type=int, default=60, help="steps per run in each of 9 rounds")
    add_csv_option(parser)
    args = parser.parse_args()
    if args.recovery_job:
        recovery_job(args.recovery_job, not args.no_kill, args.step_seconds)
        return
    torch.set_num_threads(1)
    hvd.init()
    rows = measure_recovery(args.repeats, args.lost_host)
    results = measure_commit_cost(args.steps)
    commit_rows = throughput_rows(results, [
        ratio(results, f"commit every {COMMIT_EVERY} steps, in memory", "no commits"),
        ratio(results, f"commit every {COMMIT_EVERY} steps, to disk in the background", "no commits"),
    ], model="mlp", batch_per_rank=BATCH, steps=args.steps)
    if hvd.rank() == 0:
        print(f"\nrecovery of a 3-rank job that commits every step, from a failure at step {KILL_STEP}: "
              f"kill to first completed step, and steps lost (median of {args.repeats}):")
        for row in rows:
            print(f"  {row['path']:18s} {row['seconds']:6.2f} s   {row['steps_lost']:3g} steps lost"
                  f"   (runs: {row['runs']} s)")
        print(f"\ncommitting a TorchState of the deep MLP in an elastic job, {hvd.size()} ranks, "
              "samples/s of all ranks together")
        print_throughput_rows(commit_rows)
    write_results("elastic", rows + commit_rows, {"torch": torch.__version__}, args.csv)


if __name__ == "__main__":
    main()
