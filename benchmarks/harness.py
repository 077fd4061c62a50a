"""What the benchmarks share: timing training loops across ranks, starting the peers
hvdplus is measured against inside the same MPI job, and writing the results.

Every benchmark writes its results through write_results: rank 0 replaces
`benchmarks/results/<benchmark>_np<ranks>.csv` (or the file `--csv PATH` names) with one
row per measurement, so that the committed file is always the last full run of that
benchmark at that rank count, never a mix of runs. Each row carries, after its measurement
columns, what a reader needs to trust or redo it: `ranks`, `date` (UTC, when the file was
written), `commit` (the code measured, see measured_commit.py), `machine`, `mpi` (the MPI
library's version line), `hvdplus_version`, `framework_versions` and `command`, the command
line that reproduces the run.
benchmarks/results/README.md describes the columns of each benchmark.
"""

import csv
import datetime
import os
import platform
import shlex
import socket
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from measured_commit import measured_commit

__all__ = ["throughput", "interleaved_throughputs", "array_batches", "fit_runner", "init_gloo",
           "add_csv_option", "write_results", "write_table", "library_versions", "ratio", "throughput_rows",
           "print_throughput_rows", "median_rows", "write_driver_table"]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")

# What hvdplusrun itself sets in every rank (where rank errors go), which the command sets again.
_SET_BY_THE_LAUNCHER = {"HVDPLUS_RANK_ERRORS"}
# The variables that change what hvdplus does, as the job starts: the command that
# reproduces a run sets them again. Taken at import, because a benchmark may set some
# itself while it runs (engine.py turns the response cache off): those belong to the
# script, not to the command.
_LAUNCH_ENVIRONMENT = {name: value for name, value in os.environ.items()
                       if (name == "KERAS_BACKEND" or name.startswith(("HVDPLUS_", "HOROVOD_")))
                       and not name.startswith("HVDPLUS_ELASTIC_") and name not in _SET_BY_THE_LAUNCHER}
# hvdplusrun's elastic mode sets these in the ranks: its flag goes back into the command instead.
_ELASTIC_MIN_NP = os.environ.get("HVDPLUS_ELASTIC_MIN_NP")


def throughput(run, batch, steps, participants, comm=MPI.COMM_WORLD):
    """Samples/s of all `participants` ranks together: `run(n)` trains n steps of `batch`
    samples; after 3 warm-up steps, the median of 3 rounds of `steps`, each timed from a
    barrier to the slowest rank's end. A `run` that returns (seconds, steps) timed itself
    in steady state (see fit_seconds), and that counts instead."""
    run(3)
    return statistics.median([_timed_round(run, batch, steps, participants, comm) for _ in range(3)])


def _timed_round(run, batch, steps, participants, comm):
    """Samples/s of one `run(steps)`, from a barrier to the slowest rank's end (or as `run`
    timed itself)."""
    comm.Barrier()
    start = time.perf_counter()
    measured = run(steps)
    elapsed, counted = measured if measured is not None else (time.perf_counter() - start, steps)
    elapsed = comm.allreduce(elapsed, op=MPI.MAX)
    return participants * batch * counted / elapsed


def interleaved_throughputs(runs, batch, steps, rounds=9, comm=MPI.COMM_WORLD):
    """{label: samples/s} for `runs` ({label: (run, participants)}, as in throughput()),
    measured in turns: every round times `steps` steps of each run, one after the other,
    and each result is the median over the rounds. On a machine whose speed drifts (a
    shared virtual machine), measuring one run after the other biases whole ratios; in
    turns, every run sees the same drift."""
    for run, _ in runs.values():
        run(3)
    samples = {label: [] for label in runs}
    for _ in range(rounds):
        for label, (run, participants) in runs.items():
            samples[label].append(_timed_round(run, batch, steps, participants, comm))
    return {label: statistics.median(values) for label, values in samples.items()}


def fit_seconds(model, data, skipped=5):
    """(seconds, steps) of one epoch of `model.fit(**data)`, from the end of batch `skipped`
    to the end of the last: the fit's own start and finish (building the dataset iterator,
    tearing it down, which can take as long as dozens of steps) stay out of steady state."""
    import keras

    ends = []

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            ends.append(time.perf_counter())

    model.fit(**data, epochs=1, verbose=0, callbacks=[StepClock()])
    if len(ends) <= skipped:
        raise ValueError(f"fit ran {len(ends)} steps; steady state needs more than {skipped}")
    return ends[-1] - ends[skipped - 1], len(ends) - skipped


def array_batches(x, y, batch):
    """`data_for` for fit_runner: the first n batches of arrays `x` and `y`, in order."""
    return lambda n: {"x": x[:n * batch], "y": y[:n * batch], "batch_size": batch, "shuffle": False}


def fit_runner(model, data_for, skipped=5):
    """`run(n)` for throughput(): n batches of `model.fit(**data_for(n))`, timed in steady
    state when n is more than `skipped` (a plain fit for the harness' warm-up)."""

    def run(n):
        if n <= skipped:
            model.fit(**data_for(n), epochs=1, verbose=0)
            return None
        return fit_seconds(model, data_for(n), skipped)

    return run


def init_gloo(comm):
    """torch.distributed over gloo on loopback, one process per rank of `comm`.

    Returns the `torch.distributed` module, or None when torch is not installed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist


def add_csv_option(parser):
    """`--csv PATH` on a benchmark's command line, for write_results."""
    parser.add_argument("--csv", metavar="PATH",
                        help="the CSV file to replace with the results "
                             "(default: benchmarks/results/<benchmark>_np<ranks>.csv)")


def write_results(benchmark, rows, frameworks, path=None, comm=MPI.COMM_WORLD):
    """Replace the CSV at `path` with `rows`, on rank 0; every rank calls it.

    Args:
        benchmark: the name in each row's `benchmark` column and in the default file name.
        rows: dicts of measurement columns, keys in the order the columns go; a key that
            only some rows have is left empty in the others, as is a None value.
        frameworks: {name: version} of what the benchmark runs besides hvdplus, mpi4py,
            numpy and Python, which every row names anyway.
        path: the `--csv` value; None writes benchmarks/results/<benchmark>_np<ranks>.csv.
        comm: the job: its size is the ranks of the command that reproduces the run.

    Returns the path written on rank 0, None on the other ranks.
    """
    if comm.Get_rank() != 0:
        return None
    ranks = comm.Get_size()
    return write_table(benchmark, rows, path or os.path.join(RESULTS, f"{benchmark}_np{ranks}.csv"), ranks,
                       _reproducing_command(ranks), **library_versions(frameworks))


def library_versions(frameworks=None):
    """{"mpi": the MPI library's version line, "framework_versions": a line naming `frameworks`
    ({name: version}) and mpi4py, numpy and Python}: what write_table records of the job."""
    return {"mpi": _mpi_library(), "framework_versions": _framework_versions(frameworks or {})}


def write_table(benchmark, rows, path, ranks, command, mpi, framework_versions):
    """Replace the CSV at `path` with `rows` and the context columns of the module's docstring;
    for a driver outside the MPI job it measures (benchmarks/multihost.py), which passes the
    job's library versions (library_versions, run in the job)."""
    context = {
        "ranks": ranks,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": measured_commit(),
        "machine": _machine(),
        "mpi": mpi,
        "hvdplus_version": _hvdplus_version(),
        "framework_versions": framework_versions,
        "command": command,
    }
    table = [{"benchmark": benchmark, **row, **context} for row in rows]
    columns = list(dict.fromkeys(name for row in table for name in row))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows({name: _cell(value) for name, value in row.items()} for row in table)
    shown = os.path.relpath(path)
    print(f"wrote {path if shown.startswith(os.pardir) else shown}", flush=True)
    return path


def median_rows(seconds_by_way, decimals=3, **columns):
    """For a driver's timings: one row per way, `columns` first, then its median `seconds` and
    each run's (`runs`, `;`-separated)."""
    return [{**columns, "way": way, "seconds": statistics.median(times),
             "runs": ";".join(f"{seconds:.{decimals}f}" for seconds in times)} for way, times in seconds_by_way.items()]


def write_driver_table(benchmark, rows, csv_path, command):
    """Print a driver's rows, then replace benchmarks/results/<benchmark>_np2.csv (or `csv_path`)
    with them, as write_table does."""
    for row in rows:
        shown = [str(value) for name, value in row.items() if name not in ("seconds", "runs")]
        print(f"  {' | '.join(shown)}: {row['seconds']:.3f} s   (runs: {row['runs']} s)")
    write_table(benchmark, rows, csv_path or os.path.join(RESULTS, f"{benchmark}_np2.csv"), 2, command,
                **library_versions())


def _cell(value):
    """Floats to 6 significant digits, beyond what run-to-run noise leaves; None empty."""
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else value


def _machine():
    """Host name, CPU model, cores, memory and operating system, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    except (AttributeError, ValueError, OSError):
        memory = ""
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} cores{memory}, "
            f"{platform.system()} {platform.release()} {platform.machine()}")


def _mpi_library():
    """The first line of the MPI library's version string, its runs of spaces made one."""
    return " ".join(MPI.Get_library_version().replace("\0", "").splitlines()[0].split())


def _hvdplus_version():
    import hvdplus

    return hvdplus.__version__


def _framework_versions(frameworks):
    import mpi4py
    import numpy

    versions = {**frameworks, "mpi4py": mpi4py.__version__, "numpy": numpy.__version__,
                "Python": platform.python_version()}
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def _reproducing_command(ranks):
    """hvdplusrun with this job's ranks and this script's arguments, from the repository's root,
    after the variables that change what hvdplus does (see _LAUNCH_ENVIRONMENT)."""
    script = os.path.abspath(sys.argv[0])
    if script.startswith(REPOSITORY + os.sep):
        script = os.path.relpath(script, REPOSITORY)
    variables = [f"{name}={shlex.quote(value)}" for name, value in sorted(_LAUNCH_ENVIRONMENT.items())]
    elastic = ["--min-np", _ELASTIC_MIN_NP] if _ELASTIC_MIN_NP else []
    return " ".join(variables + ["hvdplusrun", "-np", str(ranks), *elastic, "python",
                                 shlex.join([script] + sys.argv[1:])])


def mpi4py_average(*arrays, comm=MPI.COMM_WORLD):
    """The naive peer's all-reduce: each array averaged by its own mpi4py call, into new
    arrays (what a plain loop in a host function does; JAX hands a callback its own arrays)."""
    averaged = []
    for array in arrays:
        array = np.asarray(array)
        result = np.empty_like(array)
        comm.Allreduce(array, result)
        result /= comm.Get_size()
        averaged.append(result)
    return averaged


def mpi4py_average_in_place(arrays, comm=MPI.COMM_WORLD):
    """The naive peer's all-reduce where the gradients may be overwritten (torch's .grad, as
    numpy views): each averaged in place by its own mpi4py call."""
    for array in arrays:
        comm.Allreduce(MPI.IN_PLACE, array)
        array /= comm.Get_size()


def ratio(results, run, baseline, times=1):
    """(run, baseline, results[run] / results[baseline]) for throughput_rows; `times` n
    compares against n copies of the baseline (n ranks against one rank alone), and names
    the baseline so."""
    label = baseline if times == 1 else f"{times} x {baseline}"
    return run, label, results[run] / (times * results[baseline])


def throughput_rows(results, ratios, **columns):
    """The rows of a training benchmark for one model: one per run of `results`
    ({run: samples/s}) with its `samples_per_s`, then one per (run, baseline, value) of
    `ratios` with its `ratio`; `columns` (the model, its batch...) lead every row."""
    rows = [{**columns, "run": run, "samples_per_s": value, "baseline": None, "ratio": None}
            for run, value in results.items()]
    rows += [{**columns, "run": run, "samples_per_s": None, "baseline": baseline, "ratio": value}
             for run, baseline, value in ratios]
    return rows


def print_throughput_rows(rows):
    """Rows of throughput_rows as the benchmarks print them: what the CSV holds, no more."""
    width = max((len(row["run"]) for row in rows), default=0)
    for row in rows:
        if row["baseline"] is None:
            print(f"  {row['run']:{width}s} {row['samples_per_s']:10.1f} samples/s")
        else:
            print(f"  {row['run']} / {row['baseline']}: {row['ratio']:.3f}")
    print(flush=True)
