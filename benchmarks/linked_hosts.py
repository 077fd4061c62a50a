"""Training over rate-limited links between hosts, for benchmarks/regimes.py (and the
gradient compression benchmark to come): two containers from the repository's Dockerfile
(tests/testkit/cluster.py), one rank each so that every exchange crosses the link, each
container's outgoing link limited with `tc ... tbf` (benchmarks/multihost.py's limit_links)
to each rate in turn, and benchmarks/links_job.py run across them with hvdplusrun.

Needs root and podman (docs/multihost.md). The containers share this machine's two cores,
a core a rank: compute is one core's.
"""

import argparse
import json
import os
import shlex
import sys
import tempfile

import mpi4py
import numpy as np

mpi4py.rc.initialize = False  # the drivers only start the job; MPI runs in the containers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from testkit import cluster  # noqa: E402 (found through the path added above)
from harness import REPOSITORY, RESULTS, write_table  # noqa: E402
from multihost import limit_links  # noqa: E402

__all__ = ["HOSTS", "measure", "link_name", "by_way", "print_rows", "print_accuracy_goal", "main"]

HOSTS = 2


def link_name(gbit):
    return f"{gbit:g} Gbit/s" if gbit >= 1 else f"{gbit * 1000:g} Mbit/s"


def write_digits(folder):
    """scikit-learn's digits as float32 features in [0, 1], split 80/20 in a fixed order."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)
    cut = int(0.8 * len(x))
    path = os.path.join(folder, "digits.npz")
    np.savez(path, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    os.chmod(path, 0o644)


def run_job(nodes, *job_args):
    # Each rank has a core; a rank waiting in MPI would still spin on it without yielding.
    result = nodes.run("hvdplusrun", "-np", str(HOSTS), "-H", nodes.hosts([1] * HOSTS), "--mpi-args",
                       "--mca mpi_yield_when_idle 1", "env", "GLOO_SOCKET_IFNAME=eth0", "python",
                       "/bench/links_job.py", "/data/digits.npz", *job_args, timeout=3600)
    lines = [line.split("RESULT ", 1)[1] for line in result.stdout.splitlines() if "RESULT " in line]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the job failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return json.loads(lines[0])


def measure(what, gbits, ways, accuracy_steps):
    """(rows, versions): each way's throughput and bytes on the wire per sample at each rate of
    `gbits`, then, over the first rate's links, its digits accuracy after `accuracy_steps`
    steps (none where 0). `what` names the benchmark in errors."""
    reason = cluster.unavailable_reason()
    if reason:
        sys.exit(f"{what} needs podman: {reason}")
    cluster.build_image()
    rows, versions = [], {}
    with tempfile.TemporaryDirectory(prefix="hvdplus-links-") as workdir:
        data = os.path.join(workdir, "data")
        os.mkdir(data)
        os.chmod(data, 0o755)  # the ranks run as the containers' user hvd; the work folder is root's alone
        write_digits(data)
        mounts = {os.path.join(REPOSITORY, "benchmarks"): "/bench", data: "/data"}
        nodes = cluster.Cluster(HOSTS, workdir, mounts=mounts)
        try:
            for index, gbit in enumerate(gbits):
                limit_links(nodes, gbit)
                job = run_job(nodes, "--measure", "throughput", "--ways", *ways)
                versions = {"mpi": job["mpi"], "framework_versions": job["framework_versions"]}
                rows += [{"link_gbit": gbit, "measurement": "throughput", "parameters": job["parameters"], **row}
                         for row in job["rows"]]
                print(f"{link_name(gbit)}: " + ", ".join(f"{row['way']} {row['samples_per_s']:.1f} samples/s"
                                                         for row in job["rows"]), flush=True)
                if index == 0 and accuracy_steps:
                    job = run_job(nodes, "--measure", "accuracy", "--steps", str(accuracy_steps), "--ways", *ways)
                    rows += [{"link_gbit": gbit, "measurement": "accuracy", "parameters": job["parameters"], **row}
                             for row in job["rows"]]
                    print("accuracy: " + ", ".join(f"{row['way']} {100 * row['accuracy']:.1f} %"
                                                   for row in job["rows"]), flush=True)
        finally:
            nodes.remove()
    return rows, versions


def by_way(rows, measurement, column, gbit=None):
    """{way: `column`} of the rows of `measurement` (at `gbit` where given)."""
    return {row["way"]: row[column] for row in rows
            if row["measurement"] == measurement and (gbit is None or row["link_gbit"] == gbit)}


def print_rows(rows):
    speed = [row for row in rows if row["measurement"] == "throughput"]
    rates = sorted({row["link_gbit"] for row in speed}, reverse=True)
    accuracy = by_way(rows, "accuracy", "accuracy")
    sent = by_way(rows, "throughput", "bytes_sent_per_sample", min(rates))
    print(f"\n{'way':28s}" + "".join(f"{'samples/s ' + link_name(gbit):>24s}" for gbit in rates)
          + f"{'bytes/sample':>14s}{'accuracy':>10s}")
    for way in dict.fromkeys(row["way"] for row in speed):
        at = [by_way(rows, "throughput", "samples_per_s", gbit).get(way, float("nan")) for gbit in rates]
        print(f"{way:28s}" + "".join(f"{value:24.1f}" for value in at)
              + f"{sent.get(way, float('nan')):14.0f}{100 * accuracy.get(way, float('nan')):9.1f}%")


def print_accuracy_goal(rows, baseline="synchronous"):
    """The accuracy goal's line: every way within 1 point of `baseline`'s."""
    accuracy = by_way(rows, "accuracy", "accuracy")
    if accuracy:
        worst = max(abs(value - accuracy[baseline]) for value in accuracy.values())
        print(f"accuracy, furthest from {baseline}: {100 * worst:.1f} points (goal at most 1)")


def main(benchmark, description, ways, check_goals):
    """A driver's command line: measure `ways`, print them and `check_goals(rows, slowest
    gbit)`, and write benchmarks/results/<benchmark>_np2.csv (or --csv)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gbit", type=float, nargs="+", default=[1, 0.1])
    parser.add_argument("--accuracy-steps", type=int, default=160)
    parser.add_argument("--csv", metavar="PATH", help=f"default: benchmarks/results/{benchmark}_np{HOSTS}.csv")
    args = parser.parse_args()
    rows, versions = measure(f"{benchmark}.py", args.gbit, ways, args.accuracy_steps)
    print_rows(rows)
    check_goals(rows, min(args.gbit))
    command = shlex.join(["python", f"benchmarks/{benchmark}.py"] + sys.argv[1:])
    write_table(benchmark, rows, args.csv or os.path.join(RESULTS, f"{benchmark}_np{HOSTS}.csv"), HOSTS, command,
                **versions)
