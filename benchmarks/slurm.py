"""How long a 3-rank job on Slurm takes from `sbatch` to its first collective, by each way of
starting one; and how long a preemption's SIGUSR1 takes to become a durable commit and a
requeue.

    python benchmarks/slurm.py [--repeats 3] [--csv PATH]

Run on the machine itself, as root, with podman: it builds the Slurm test image and starts the
test cluster (tests/testkit/slurm_cluster.py: Slurm 22.05 with PMIx, hvdplus, Open MPI from
PyPI and torch's CPU build; a controller and 3 compute nodes, each a container, sharing a folder
at /shared). Every job takes the 3 nodes, one rank on each, and starts only once all 3 are idle.
The driver times, in turns, the median of --repeats after one round that is not timed (it warms
the nodes' file caches):
- sbatch to the first collective: from just before `sbatch` to the moment rank 0's first
  all-reduce is back, which tests/containers/first_collective.py writes to /shared as
  `time.time()` (the containers share this machine's clock). The jobs:
  examples/slurm/hvdplusrun.sbatch (hvdplusrun in the allocation; mpirun starts its daemons
  through srun), examples/slurm/srun.sbatch (`srun --mpi=pmix`, every task a rank) and, as the
  peer, torchrun under srun (TORCHRUN_SCRIPT: one torchrun per node, a c10d rendezvous on the
  allocation's first node, a gloo all_reduce). Each job's ranks import torch and all-reduce a
  torch tensor: hvdplus's through hvdplus.torch. Slurm's scheduling and the start of the job's
  steps are in every figure.
- SIGUSR1 to a commit and to a requeue: examples/slurm/hvdplusrun.sbatch runs
  tests/containers/resumable_training.py, a step every 0.1 s and a commit after each, with its
  commit folder in /shared. Once its first step is done, and 5 s later (hvdplusrun holds a
  SIGUSR1 that comes within 5 s of the launch until then: the ranks may not run Python yet),
  from just before `scancel --signal=USR1 --batch` to the newest modification time of the
  commit files there (the commit a requeued job resumes from), and to the first look at
  `scontrol show job` (every 0.05 s, in the controller) that shows `Restarts` gone up. Then the
  driver cancels the requeued job.

Writes benchmarks/results/slurm_np3.csv (see harness.write_table); `mpi` and
`framework_versions` are the containers'.
"""

import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import mpi4py

mpi4py.rc.initialize = False  # this driver only starts jobs; MPI runs in the containers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from testkit import cluster, slurm_cluster  # noqa: E402 (found through the path added above)
from harness import RESULTS, median_rows, write_table  # noqa: E402
from hvdplus.runner.supervise import PASS_ON_AFTER_SECONDS  # noqa: E402

NODES = 3
SHARED = slurm_cluster.SHARED
JOB_TIMEOUT_S = 300
FIRST_COLLECTIVE = f"{slurm_cluster.JOBS}/first_collective.py"
TORCHRUN = "torchrun under srun (c10d, gloo)"
# Each way of starting the job: the example script it submits (the peer's is TORCHRUN_SCRIPT).
FIRST_COLLECTIVE_WAYS = {"hvdplusrun (hvdplusrun.sbatch)": "hvdplusrun.sbatch",
                         "srun --mpi=pmix (srun.sbatch)": "srun.sbatch", TORCHRUN: None}
SIGNAL_WAYS = ("a durable commit in COMMIT_DIR", "Restarts incremented (requeued)")
TORCHRUN_SCRIPT = """#!/bin/bash
# One torchrun per node (srun starts one task on each), each starting one process; they meet
# at a c10d rendezvous on the allocation's first node.
#SBATCH --job-name=torchrun
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
exec srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=1 --rdzv-backend=c10d \\
    --rdzv-endpoint="$HEAD:29500" --rdzv-id="$SLURM_JOB_ID" {program} --torch --time-file {time_file}
"""
# Polls in the controller, so that each look costs an scontrol call, not a podman exec; says
# when it has started, and prints the time of the first look that finds the job requeued.
POLL_RESTARTS = """echo polling
until scontrol show job -o {job} | grep -q ' Restarts=[1-9]'; do sleep 0.05; done
date +%s.%N
"""
CONTAINER_VERSIONS = """
import json, platform, mpi4py, numpy, torch
mpi4py.rc.initialize = False
from mpi4py import MPI
print(json.dumps({"mpi": " ".join(MPI.Get_library_version().replace("\\0", "").splitlines()[0].split()),
                  "torch": torch.__version__, "mpi4py": mpi4py.__version__, "numpy": numpy.__version__,
                  "Python": platform.python_version()}))
"""


class Run:
    """One job of the benchmark, in a folder of its own under the shared folder: `host` is
    where this machine sees it, `inside` where the jobs do."""

    def __init__(self, slurm, shared, name):
        self.slurm, self.name = slurm, name
        self.host = os.path.join(shared, name)
        self.inside = f"{SHARED}/{name}"
        os.mkdir(self.host)
        os.chmod(self.host, 0o777)  # the user hvd writes there
        self.job = None

    def submit(self, script):
        """sbatch `script` on the 3 nodes once they are idle; the time just before sbatch."""
        self.slurm.wait_for_idle_nodes(NODES, JOB_TIMEOUT_S)
        started = time.time()
        self.job = self.slurm.submit(script, f"--nodes={NODES}", "--ntasks-per-node=1",
                                     f"--output={self.inside}/output", "--open-mode=append")
        return started

    def failure(self, what):
        fields = self.slurm.job(self.job)
        output = self.read("output") or ""
        return RuntimeError(f"{self.name} (job {self.job}): {what}; JobState={fields.get('JobState')}, "
                            f"ExitCode={fields.get('ExitCode')}\n{output[-4000:]}\n{self.slurm.logs()}")

    def read(self, file):
        path = os.path.join(self.host, file)
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            return handle.read()


def first_collective_seconds(run, script):
    """Seconds from just before sbatch of `script` to rank 0's first collective done."""
    started = run.submit(script)
    fields = run.slurm.wait_for_job(run.job, timeout=JOB_TIMEOUT_S)
    done = run.read("first-collective")
    if fields["JobState"] != "COMPLETED" or done is None:
        raise run.failure("no first collective")
    return float(done) - started


def first_collective_script(way, time_file):
    """The batch script of `way` (a key of FIRST_COLLECTIVE_WAYS) for the job of
    tests/containers/first_collective.py, its rank 0 writing to `time_file`."""
    if way == TORCHRUN:
        return TORCHRUN_SCRIPT.format(program=FIRST_COLLECTIVE, time_file=time_file)
    return slurm_cluster.batch_script(FIRST_COLLECTIVE_WAYS[way], PROGRAM=FIRST_COLLECTIVE,
                                      ARGUMENTS=f"--time-file {time_file}")


def wait_for_file(run, file, timeout=JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while run.read(file) is None:
        if time.monotonic() > deadline:
            raise run.failure(f"no {file} within {timeout} s")
        time.sleep(0.1)


def start_restarts_poller(slurm, job):
    """The process that polls `job` in the controller, once it polls."""
    poller = subprocess.Popen(["podman", "exec", "-u", "hvd", slurm.controller, "timeout", str(JOB_TIMEOUT_S),
                               "bash", "-c", POLL_RESTARTS.format(job=job)], stdout=subprocess.PIPE, text=True)
    if poller.stdout.readline().strip() != "polling":
        poller.kill()
        raise RuntimeError(f"the poller of job {job} did not start")
    return poller


def newest_commit(run):
    """The newest modification time of a commit file in the run's commit folder; 0 if none."""
    return max((os.stat(path).st_mtime for path in glob.glob(os.path.join(run.host, "commits", "*.commit"))),
               default=0)


def signal_seconds(run):
    """(seconds from SIGUSR1 to the commit on shared storage, seconds to the requeue) of a
    training job that runs under hvdplusrun."""
    run.submit(slurm_cluster.batch_script(
        "hvdplusrun.sbatch", PROGRAM=f"{slurm_cluster.JOBS}/resumable_training.py", COMMIT_DIR=f"{run.inside}/commits",
        ARGUMENTS=f"--steps 200 --step-seconds 0.1 --log-dir {run.inside}/logs --ready-file {run.inside}/ready"))
    wait_for_file(run, "ready")
    # hvdplusrun holds a SIGUSR1 that comes this soon after mpirun started, until the ranks
    # run Python and keep it: what is timed is a signal to a job already training.
    time.sleep(PASS_ON_AFTER_SECONDS)
    poller = start_restarts_poller(run.slurm, run.job)
    signalled = time.time()
    sent = run.slurm.run("scancel", "--signal=USR1", "--batch", run.job)
    polled = poller.communicate(timeout=JOB_TIMEOUT_S + 10)[0].split()
    if sent.returncode != 0 or not polled:
        raise run.failure(f"not requeued after scancel --signal=USR1 --batch ({sent.stderr.strip()})")
    requeued = float(polled[-1])
    run.slurm.run("scancel", run.job)
    run.slurm.wait_for_job(run.job, timeout=JOB_TIMEOUT_S)
    committed = newest_commit(run)
    if committed < signalled:
        raise run.failure("no commit in the commit folder after the signal")
    return committed - signalled, requeued - signalled


def container_versions(slurm):
    """The `mpi` and `framework_versions` columns, as the jobs' containers have them."""
    found = json.loads(slurm.run("python", "-c", CONTAINER_VERSIONS).stdout)
    slurm_version = slurm.run("sinfo", "--version").stdout.split()[-1]
    libraries = {"Slurm": slurm_version, **{name: found[name] for name in ("torch", "mpi4py", "numpy", "Python")}}
    return {"mpi": found["mpi"], "framework_versions": ", ".join(f"{name} {v}" for name, v in libraries.items())}


def measure(slurm, shared, repeats):
    """The rows of the CSV file: each way's seconds to the first collective, then the signal's
    to a commit and to a requeue."""
    first, signal = {way: [] for way in FIRST_COLLECTIVE_WAYS}, {way: [] for way in SIGNAL_WAYS}
    for repeat in range(repeats + 1):
        timed = repeat > 0
        for index, way in enumerate(FIRST_COLLECTIVE_WAYS):
            run = Run(slurm, shared, f"first-{repeat}-{index}")
            seconds = first_collective_seconds(run, first_collective_script(way, f"{run.inside}/first-collective"))
            print(f"  {'round ' + str(repeat) if timed else 'not timed'}: {way}: {seconds:.3f} s", flush=True)
            if timed:
                first[way].append(seconds)
        if timed:
            for way, seconds in zip(SIGNAL_WAYS, signal_seconds(Run(slurm, shared, f"signal-{repeat}"))):
                print(f"  round {repeat}: SIGUSR1 to {way}: {seconds:.3f} s", flush=True)
                signal[way].append(seconds)
    return median_rows(first, measurement="sbatch to first collective") + median_rows(signal, measurement="SIGUSR1 to")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/slurm_np3.csv")
    args = parser.parse_args()
    reason = cluster.unavailable_reason()
    if reason:
        sys.exit(f"slurm.py needs podman: {reason}")
    slurm_cluster.build_image()
    with tempfile.TemporaryDirectory(prefix="hvdplus-slurm-bench-") as workdir:
        with slurm_cluster.SlurmCluster(NODES, workdir, shared=True) as slurm:
            shared = str(slurm.shared)
            versions = container_versions(slurm)
            rows = measure(slurm, shared, args.repeats)
    for row in rows:
        print(f"  {row['measurement']}: {row['way']}: {row['seconds']:.3f} s   (runs: {row['runs']} s)")
    command = shlex.join(["python", "benchmarks/slurm.py"] + sys.argv[1:])
    write_table("slurm", rows, args.csv or os.path.join(RESULTS, f"slurm_np{NODES}.csv"), NODES, command, **versions)


if __name__ == "__main__":
    main()
