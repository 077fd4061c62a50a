"""All-reduce across real hosts over rate-limited links: hvdplus' ring, hierarchical and
auto (called directly, and through hvd.allreduce and the engine) against MPI's own
Allreduce, and each against the alpha-beta cost model.

    python benchmarks/multihost.py [--gbit 1 10] [--layouts 2x2 4x1] [--mib 1 4 16 64 256]
                                   [--autotune-mib 16 64] [--csv PATH]

Run on the machine itself, as root, with podman (see docs/multihost.md): for each layout
it starts one container per host from the repository's Dockerfile (tests/testkit/cluster.py),
limits each container's outgoing link with `tc ... tbf` to each rate in turn (every host has
a link of that rate to the others), and runs benchmarks/multihost_job.py across them with
hvdplusrun. The job measures the model's constants on those links (latency and seconds per
byte between hosts and inside one, numpy's reduction speed) and every algorithm at every
size, in turns; then, in a job of its own per size of --autotune-mib, it lets the engine's
autotuner choose (HOROVOD_AUTOTUNE=1) and measures its choice beside MPI, ring and
hierarchical. This prints, per size: time, bus bandwidth, the ratio to MPI's Allreduce,
and the model's prediction (benchmarks/cost_model.py) with measured / model; then checks
the targets: auto (both ways, and autotuned) within 10 % of the best algorithm,
hierarchical against the flat ring on 2 x 2 over the slowest link, measured within 25 % of
the model. Results go to benchmarks/results/multihost_np4.csv.

The containers share this machine's cores, so at rates the cores cannot feed (about 10
Gbit/s and more on 2 cores) the time is the processors', not the link's, and the model,
which counts the link's bytes, says less than the run takes.
"""

import argparse
import json
import os
import shlex
import sys
import tempfile

import mpi4py

mpi4py.rc.initialize = False  # this driver only starts the job; MPI runs in the containers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from testkit import cluster  # noqa: E402 (found through the path added above)
import cost_model  # noqa: E402
from multihost_job import AUTOTUNED, ENGINE  # noqa: E402
from harness import REPOSITORY, RESULTS, write_table  # noqa: E402

LAYOUTS = {"2x2": [2, 2], "4x1": [1, 1, 1, 1]}
MODELLED = ("ring", "hierarchical")
AUTO = ("auto", ENGINE)  # hvdplus choosing the algorithm; the engine's path too
ALGORITHMS = ("MPI Allreduce", "ring", "hierarchical")  # the ones auto picks among


def limit_links(nodes, gbit):
    """Every container's outgoing link at `gbit` Gbit/s: a token bucket on its eth0, set from
    this machine inside the container's network namespace (the image needs no tc)."""
    burst = f"{max(64, int(gbit * 128))}kb"  # a few milliseconds' worth, above one GSO packet
    for name in nodes.names:
        cluster.subprocess.run(["nsenter", "-t", nodes.pid(name), "-n", "tc", "qdisc", "replace", "dev", "eth0",
                                "root", "tbf", "rate", f"{gbit}gbit", "burst", burst, "latency", "5ms"],
                               check=True, capture_output=True)


def run_job(nodes, slots, mib, rounds, autotune=False):
    # The containers' ranks share this machine's two cores, which MPI cannot see from inside
    # them: without yielding, a rank waiting in MPI spins and takes a core from the network.
    tuning = ["--autotune"] if autotune else []
    result = nodes.run("env", f"HOROVOD_AUTOTUNE={int(autotune)}", "hvdplusrun", "-np", str(sum(slots)),
                       "-H", nodes.hosts(slots), "--mpi-args", "--mca mpi_yield_when_idle 1", "python",
                       "/bench/multihost_job.py", "--rounds", str(rounds), *tuning, "--mib", *map(str, mib),
                       timeout=1800)
    lines = [line.split("RESULT ", 1)[1] for line in result.stdout.splitlines() if "RESULT " in line]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the job failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return json.loads(lines[0])


def tuned_rows(gbit, layout, job):
    """The CSV's rows of an autotuning run: each method's time, the tuner's choice beside it."""
    ranks = job["hosts"] * job["per_host"]
    return [{"link_gbit": gbit, "layout": layout, "measurement": "allreduce, autotuning job",
             "method": row["method"], "bytes": row["bytes"], "seconds": row["seconds"],
             "busbw_GBps": cost_model.bus_bandwidth(row["bytes"], row["seconds"], ranks) / 1e9,
             "tuned": job["tuned"], "tuning_steps": job["tuning_steps"]} for row in job["rows"]]


def table_rows(gbit, layout, job):
    """The CSV's rows of one run: its constants, then each (size, method) with the model's view."""
    links = cost_model.Links(**job["constants"])
    hosts, per_host = job["hosts"], job["per_host"]
    ranks = hosts * per_host
    rows = [{"link_gbit": gbit, "layout": layout, "measurement": "constant", "method": name, "seconds": value}
            for name, value in job["constants"].items()]
    mpi = {row["bytes"]: row["seconds"] for row in job["rows"] if row["method"] == "MPI Allreduce"}
    for row in job["rows"]:
        nbytes, method, seconds = row["bytes"], row["method"], row["seconds"]
        modelled = method if method in MODELLED else row["auto_chose"] if method in AUTO else None
        model = cost_model.PREDICTORS[modelled](nbytes, hosts, per_host, links) if modelled in MODELLED else None
        rows.append({"link_gbit": gbit, "layout": layout, "measurement": "allreduce", "method": method,
                     "bytes": nbytes, "seconds": seconds,
                     "busbw_GBps": cost_model.bus_bandwidth(nbytes, seconds, ranks) / 1e9,
                     "ratio_to_mpi": mpi[nbytes] / seconds, "model_seconds": model,
                     "measured_over_model": seconds / model if model else None})
    return rows


def print_run(gbit, layout, rows):
    print(f"\n{layout} over {gbit} Gbit/s links")
    print("  constants: " + ", ".join(f"{row['method']} {row['seconds']:.3g}" for row in rows
                                      if row["measurement"] == "constant"))
    print(f"  {'MiB':>6s} {'method':14s} {'time s':>9s} {'busbw GB/s':>10s} {'x MPI':>6s} {'model s':>9s} "
          f"{'meas/model':>10s}")
    for row in rows:
        if row["measurement"] != "allreduce":
            continue
        model = ("" if row["model_seconds"] is None
                 else f"{row['model_seconds']:9.4f} {row['measured_over_model']:10.2f}")
        print(f"  {row['bytes'] / 2**20:6g} {row['method']:14s} {row['seconds']:9.4f} {row['busbw_GBps']:10.3f} "
              f"{row['ratio_to_mpi']:6.2f} {model}", flush=True)


def print_tuned(rows):
    tuned = next(row for row in rows if row["method"] == AUTOTUNED)
    print(f"  autotuning job, {tuned['bytes'] / 2**20:g} MiB: chose {tuned['tuned']} after "
          f"{tuned['tuning_steps']} all-reduces; " + ", ".join(f"{row['method']} {row['seconds']:.4f} s"
                                                               for row in rows), flush=True)


def _seconds_by_run(rows, measurement):
    """{(link_gbit, layout, bytes, method): seconds} of the rows of `measurement`."""
    return {(row["link_gbit"], row["layout"], row["bytes"], row["method"]): row["seconds"] for row in rows
            if row["measurement"] == measurement}


def _over_best(seconds, run, method):
    """`method`'s time in `run` (link_gbit, layout, bytes) over the best algorithm's there."""
    return seconds[run + (method,)] / min(seconds[run + (algorithm,)] for algorithm in ALGORITHMS)


def check_targets(rows, slowest_gbit):
    """One line per target, with the numbers behind it."""
    measured = [row for row in rows if row["measurement"] == "allreduce"]
    by_key = _seconds_by_run(rows, "allreduce")
    runs = sorted({key[:3] for key in by_key})
    for method in AUTO:
        worst = max((_over_best(by_key, run, method), run) for run in runs)
        print(f"\n{method} / best algorithm, worst case: {worst[0]:.3f} at {worst[1][1]}, "
              f"{worst[1][0]} Gbit/s, {worst[1][2] / 2**20:g} MiB (target <= 1.10)")
    tuned = _seconds_by_run(rows, "allreduce, autotuning job")
    if tuned:
        print(f"{AUTOTUNED} / best algorithm of its job: " + ", ".join(
            f"{_over_best(tuned, run, AUTOTUNED):.3f} ({run[1]}, {run[0]} Gbit/s, {run[2] / 2**20:g} MiB)"
            for run in sorted({key[:3] for key in tuned})) + " (target <= 1.10)")
    gains = [(by_key[run + ("ring",)] / by_key[run + ("hierarchical",)], run[2]) for run in runs
             if run[0] == slowest_gbit and run[1] == "2x2"]
    print("hierarchical speed-up over the flat ring, 2x2 at {} Gbit/s: {} (target >= 1.5; at most 1.5 by the bytes "
          "each host sends)".format(slowest_gbit, ", ".join(f"{gain:.2f} at {nbytes / 2**20:g} MiB"
                                                             for gain, nbytes in gains)))
    for gbit in sorted({run[0] for run in runs}):
        errors = [abs(row["measured_over_model"] - 1) for row in measured
                  if row["link_gbit"] == gbit and row["measured_over_model"] is not None]
        print(f"measured / model at {gbit} Gbit/s: worst {max(errors) * 100:.0f} % off, "
              f"{sum(error <= 0.25 for error in errors)} of {len(errors)} within 25 %")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gbit", type=float, nargs="+", default=[1, 10])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--autotune-mib", type=float, nargs="*", default=[16, 64],
                        help="sizes at which a job of its own tunes the engine (HOROVOD_AUTOTUNE=1) first")
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/multihost_np4.csv")
    args = parser.parse_args()
    reason = cluster.unavailable_reason()
    if reason:
        sys.exit(f"multihost.py needs podman: {reason}")
    cluster.build_image()
    rows, versions = [], {}
    with tempfile.TemporaryDirectory(prefix="hvdplus-multihost-") as workdir:
        for layout in args.layouts:
            slots = LAYOUTS[layout]
            nodes = cluster.Cluster(len(slots), workdir, mounts={os.path.join(REPOSITORY, "benchmarks"): "/bench"})
            try:
                for gbit in args.gbit:
                    limit_links(nodes, gbit)
                    job = run_job(nodes, slots, args.mib, args.rounds)
                    versions = {"mpi": job["mpi"], "framework_versions": job["framework_versions"]}
                    run_rows = table_rows(gbit, layout, job)
                    print_run(gbit, layout, run_rows)
                    rows += run_rows
                    for mib in args.autotune_mib:
                        run_rows = tuned_rows(gbit, layout, run_job(nodes, slots, [mib], args.rounds, autotune=True))
                        print_tuned(run_rows)
                        rows += run_rows
            finally:
                nodes.remove()
    check_targets(rows, min(args.gbit))
    command = shlex.join(["python", "benchmarks/multihost.py"] + sys.argv[1:])
    write_table("multihost", rows, args.csv or os.path.join(RESULTS, "multihost_np4.csv"), 4, command, **versions)


if __name__ == "__main__":
    main()
