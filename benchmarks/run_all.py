"""Measure every benchmark again, one at a time, then regenerate the docs' tables and figures.

    python benchmarks/run_all.py [--only NAME...] [--skip NAME...] [--list]

Runs each benchmark of BENCHMARKS, in turn and alone (two at once would each measure the
other's load), from the repository's root, with the command its CSV file under
benchmarks/results/ records in its `command` column; checks that the run rewrote that file
with that command; and at the end rewrites the tables generated from the CSV files
(benchmarks/tables.py) and redraws the figures (benchmarks/plot.py, when matplotlib is
installed). The first benchmark that fails stops the run, with a message naming it and the
command that goes on from it; the tables are then left as they were.

multihost, regimes and slurm run containers, so they need root and podman (docs/multihost.md,
docs/slurm.md), and multihost takes much longer than the others: `--skip multihost regimes slurm`
leaves them out.
"""

import argparse
import csv
import dataclasses
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
import time

import tables

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclasses.dataclass(frozen=True)
class Benchmark:
    results: str  # its file under benchmarks/results/
    command: str  # from the repository's root; what the file's `command` column records

    @property
    def name(self):
        """What --only and --skip take: the file's name without `_np<ranks>.csv`."""
        return self.results.rsplit("_np", 1)[0]


BENCHMARKS = (
    Benchmark("collectives_np2.csv", "hvdplusrun -np 2 python benchmarks/collectives.py"),
    Benchmark("engine_np2.csv", "hvdplusrun -np 2 python benchmarks/engine.py"),
    Benchmark("waiting_np2.csv", "hvdplusrun -np 2 python benchmarks/waiting.py"),
    Benchmark("torch_training_np2.csv", "hvdplusrun -np 2 python benchmarks/torch_training.py"),
    Benchmark("tensorflow_training_np2.csv", "hvdplusrun -np 2 python benchmarks/tensorflow_training.py"),
    Benchmark("keras_training_torch_np2.csv",
              "KERAS_BACKEND=torch hvdplusrun -np 2 python benchmarks/keras_training.py"),
    Benchmark("keras_training_tensorflow_np2.csv",
              "KERAS_BACKEND=tensorflow hvdplusrun -np 2 python benchmarks/keras_training.py"),
    Benchmark("keras_training_jax_np2.csv",
              "KERAS_BACKEND=jax hvdplusrun -np 2 python benchmarks/keras_training.py"),
    Benchmark("keras_breakdown_tensorflow_np2.csv",
              "KERAS_BACKEND=tensorflow hvdplusrun -np 2 python benchmarks/keras_breakdown.py"),
    Benchmark("keras_breakdown_jax_np2.csv", "KERAS_BACKEND=jax hvdplusrun -np 2 python benchmarks/keras_breakdown.py"),
    Benchmark("keras_breakdown_torch_np2.csv",
              "KERAS_BACKEND=torch hvdplusrun -np 2 python benchmarks/keras_breakdown.py"),
    Benchmark("elastic_np2.csv", "hvdplusrun -np 2 --min-np 2 python benchmarks/elastic.py --lost-host"),
    Benchmark("pipeline_np2.csv", "hvdplusrun -np 2 python benchmarks/pipeline.py"),
    Benchmark("balance_np2.csv", "hvdplusrun -np 2 python benchmarks/balance.py"),
    Benchmark("balance_np4.csv", "hvdplusrun -np 4 python benchmarks/balance.py"),
    Benchmark("autotune_np2.csv", "HOROVOD_AUTOTUNE=1 hvdplusrun -np 2 python benchmarks/autotune.py"),
    Benchmark("multihost_np4.csv", "python benchmarks/multihost.py"),
    Benchmark("regimes_np2.csv", "python benchmarks/regimes.py"),
    Benchmark("startup_np2.csv", "python benchmarks/startup.py"),
    Benchmark("ray_recovery_np2.csv", "python benchmarks/ray_recovery.py"),
    Benchmark("spark_np2.csv", "python benchmarks/spark.py"),
    Benchmark("slurm_np3.csv", "python benchmarks/slurm.py"),
)


def recorded(benchmark):
    """(date, commit, command) the benchmark's CSV file records, or None without the file."""
    path = os.path.join(RESULTS, benchmark.results)
    if not os.path.exists(path):
        return None
    with open(path, newline="") as handle:
        row = next(csv.DictReader(handle), {})
    return row.get("date", ""), row.get("commit", ""), row.get("command", "")


def environment(variables):
    """This process' environment with `variables` set, and none of the variables the command
    that a CSV records would otherwise pick up (harness._LAUNCH_ENVIRONMENT: KERAS_BACKEND,
    HVDPLUS_*, HOROVOD_*), so that a run is the declared command and nothing else. `python`
    and `hvdplusrun` are this interpreter's, activated or not."""
    environ = {name: value for name, value in os.environ.items()
               if not (name == "KERAS_BACKEND" or name.startswith(("HVDPLUS_", "HOROVOD_")))}
    environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + environ.get("PATH", "")
    return {**environ, **variables}


def split_command(command):
    """(variables, argv) of a command line `NAME=value ... program arguments...`."""
    words = shlex.split(command)
    assignments = list(itertools.takewhile(ASSIGNMENT.match, words))
    return dict(word.split("=", 1) for word in assignments), words[len(assignments):]


def run(benchmark):
    """Run one benchmark; the reason it failed, or None."""
    variables, argv = split_command(benchmark.command)
    started = time.time()
    status = subprocess.run(argv, cwd=REPOSITORY, env=environment(variables)).returncode
    if status != 0:
        return f"exit status {status}"
    path = os.path.join(RESULTS, benchmark.results)
    if not os.path.exists(path) or os.path.getmtime(path) < started:
        return f"it did not write benchmarks/results/{benchmark.results}"
    command = recorded(benchmark)[2]
    if command != benchmark.command:
        return f"benchmarks/results/{benchmark.results} records the command {command!r}"
    return None


def redraw_figures():
    if importlib.util.find_spec("matplotlib") is None:
        print("figures not redrawn: matplotlib is missing (pip install -e '.[benchmarks]'), "
              "then python benchmarks/plot.py")
        return
    subprocess.run([sys.executable, os.path.join("benchmarks", "plot.py")], cwd=REPOSITORY, check=True)


def list_benchmarks():
    for benchmark in BENCHMARKS:
        found = recorded(benchmark)
        when = f"measured {found[0] or '?'}, commit {found[1] or 'not recorded'}" if found else "no results yet"
        print(f"{benchmark.name:26s} {benchmark.command}\n{'':26s} {when}")


def main():
    names = [benchmark.name for benchmark in BENCHMARKS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="multihost, regimes and slurm need root and podman, and multihost runs far "
                                            "longer than the rest: --skip multihost regimes slurm leaves them out.")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=names, help=f"run these only: {', '.join(names)}")
    parser.add_argument("--skip", nargs="+", metavar="NAME", choices=names, default=[], help="run all but these")
    parser.add_argument("--list", action="store_true", help="list the benchmarks, their commands and when their "
                                                            "results were measured; run nothing")
    args = parser.parse_args()
    if args.list:
        list_benchmarks()
        return
    chosen = [benchmark for benchmark in BENCHMARKS
              if (args.only is None or benchmark.name in args.only) and benchmark.name not in args.skip]
    for index, benchmark in enumerate(chosen):
        print(f"\n[{index + 1}/{len(chosen)}] {benchmark.name}: {benchmark.command}", flush=True)
        started = time.monotonic()
        failure = run(benchmark)
        if failure:
            rest = " ".join(later.name for later in chosen[index:])
            sys.exit(f"\nrun_all: benchmark {benchmark.name} failed ({failure}): {benchmark.command}\n"
                     f"Those before it have written their new results; the tables were not regenerated. "
                     f"To go on from it: python benchmarks/run_all.py --only {rest}")
        print(f"[{index + 1}/{len(chosen)}] {benchmark.name}: done in {time.monotonic() - started:.0f} s", flush=True)
    changed = tables.rewrite()
    print("\n" + ("rewrote " + ", ".join(changed) if changed else "every generated table was up to date"))
    redraw_figures()


if __name__ == "__main__":
    main()
