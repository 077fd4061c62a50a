"""One benchmark at two commits, in turns, in one run: does a change cost anything?

    python benchmarks/compare_commits.py --base fa0684a --benchmark engine --turns 3

Checks the base commit out into a temporary git worktree and runs the benchmark under
`hvdplusrun -np <ranks>` alternately from that tree and from this one (base, head, head,
base, base, head...), so that both sides see the same machine load over the run. Each side imports the
hvdplus of its own tree (PYTHONPATH). The medians over the turns of each measurement, and
head's against base's, go to benchmarks/results/compare_<benchmark>_np<ranks>.csv with both
commits. `head_worse_by` above 1 means head is slower: its seconds over base's, or base's
samples per second over head's.
"""

import argparse
import csv
import datetime
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from measured_commit import measured_commit

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(HERE)
# Columns that describe a run rather than a measurement (see harness.write_results).
RUN_COLUMNS = {"benchmark", "ranks", "date", "commit", "machine", "mpi", "hvdplus_version", "framework_versions",
               "command", "base_commit", "turns"}
# Columns derived from a row's value, which differ from run to run like the value itself.
DERIVED_COLUMNS = {"baseline", "ratio", "seconds_over_baseline", "algbw_GBps", "busbw_GBps", "ratio_to_raw_mpi"}
# The measured value of a row, and whether more of it is better.
VALUES = (("seconds", False), ("samples_per_s", True))


def git(*args, cwd=REPOSITORY) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def run_side(tree, benchmark, ranks, csv_path, extra):
    """Run `benchmark` from `tree` at `ranks` ranks, writing its CSV to `csv_path`."""
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "hvdplus.runner", "-np", str(ranks), sys.executable,
               os.path.join(tree, "benchmarks", f"{benchmark}.py"), "--csv", csv_path, *extra]
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


def run_context(csv_path):
    """The machine, MPI and versions a run's CSV records (the same in every row)."""
    with open(csv_path, newline="") as handle:
        first = next(csv.DictReader(handle), {})
    return {column: first.get(column, "") for column in ("machine", "mpi", "hvdplus_version", "framework_versions")}


def measurements(csv_path):
    """{measurement key: (value, more is better)} of one run's CSV."""
    found = {}
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            for column, more_is_better in VALUES:
                if row.get(column):
                    key = tuple((name, value) for name, value in row.items()
                                if name not in RUN_COLUMNS | DERIVED_COLUMNS and name not in dict(VALUES) and value)
                    found[key] = (float(row[column]), more_is_better)
    return found


def compare(runs_by_side):
    """Rows of medians per measurement, base against head."""
    base_runs, head_runs = runs_by_side["base"], runs_by_side["head"]
    rows = []
    for key in base_runs[0]:
        if not all(key in run for run in base_runs + head_runs):
            continue
        more_is_better = base_runs[0][key][1]
        base = statistics.median(run[key][0] for run in base_runs)
        head = statistics.median(run[key][0] for run in head_runs)
        worse = base / head if more_is_better else head / base
        rows.append({**dict(key), "value": "samples_per_s" if more_is_better else "seconds",
                     "base_median": base, "head_median": head, "head_worse_by": worse})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (head: this tree)")
    parser.add_argument("--benchmark", required=True, help="a benchmark under benchmarks/, without .py")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/compare_<benchmark>_np<ranks>.csv")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: arguments for the benchmark")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    base_commit = git("rev-parse", "--short", args.base)
    head_commit = measured_commit()
    runs, context = {"base": [], "head": []}, {}
    with tempfile.TemporaryDirectory(prefix="hvdplus-compare-") as scratch:
        base_tree = os.path.join(scratch, "base")
        git("worktree", "add", "--detach", base_tree, base_commit)
        try:
            sides = (("base", base_tree), ("head", REPOSITORY))
            for turn in range(args.turns):
                # Base first in even turns, head first in odd ones: a drift of the machine
                # over the run (warming up, another process) then favours neither side.
                for side, tree in (sides if turn % 2 == 0 else sides[::-1]):
                    path = os.path.join(scratch, f"{side}-{turn}.csv")
                    run_side(tree, args.benchmark, args.ranks, path, extra)
                    runs[side].append(measurements(path))
                    if side == "head":
                        context = run_context(path)
                    print(f"turn {turn + 1}/{args.turns}: {side} done", flush=True)
        finally:
            git("worktree", "remove", "--force", base_tree)
    rows = compare(runs)
    path = args.csv or os.path.join(HERE, "results", f"compare_{args.benchmark}_np{args.ranks}.csv")
    command = "python benchmarks/compare_commits.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    # `commit` and `date` as every result file has them (benchmarks/tables.py reads them): the
    # code this file speaks for is head's.
    columns = {"base_commit": base_commit, "commit": head_commit, "turns": args.turns, "ranks": args.ranks,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **context,
               "command": command}
    with open(path, "w", newline="") as handle:
        fields = list(dict.fromkeys(name for row in rows for name in row)) + list(columns)
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **columns})
    for row in rows:
        label = " ".join(str(value) for name, value in row.items()
                         if name not in ("value", "base_median", "head_median", "head_worse_by"))
        print(f"  {label:60s} base {row['base_median']:.6g}  head {row['head_median']:.6g}  "
              f"head worse by {row['head_worse_by']:.3f}x")
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
