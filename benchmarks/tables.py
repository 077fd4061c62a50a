"""The docs' tables of benchmark results, rendered from the CSV files under benchmarks/results/.

    python benchmarks/tables.py           # rewrite every generated table of DOCUMENTS
    python benchmarks/tables.py --check   # exit 1, naming each table that differs from its CSV files

A generated table sits between two marker comments in a markdown file:

    <!-- results:torch_training -->
    ...
    <!-- /results -->

Everything between the markers is TABLES["torch_training"] rendered from its CSV files, and
ends with the date and commit each file was measured at (its `date` and `commit` columns, see
harness.write_results), so the numbers on a page are those of the files beside the code, and
a rewrite replaces whatever was written there by hand. The prose around the markers says what
the numbers mean, without repeating them. `results:machine` renders the machine, MPI library
and frameworks that every other table of its page was measured with, but for a table measured
in containers (Table.own_machine), which names its own.

Reads files only: it needs neither MPI nor any framework (tests/test_result_tables.py runs it).
"""

import argparse
import csv
import difflib
import os
import re
import sys
from typing import Callable, NamedTuple, Optional, Tuple

__all__ = ["TABLES", "DOCUMENTS", "Results", "render", "render_document", "stale_tables", "rewrite"]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")
DOCUMENTS = ("docs/performance.md", "docs/elastic.md", "docs/training-regimes.md", "README.md")
MARKED = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.DOTALL)
MACHINE = "machine"
MIB = 1024 * 1024


class Results:
    """The rows of one CSV file of benchmarks/results/, all strings as the file holds them."""

    def __init__(self, file, directory=RESULTS):
        self.file = file
        self.path = os.path.join(directory, file)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"{os.path.relpath(self.path, REPOSITORY)} is missing: "
                                    f"python benchmarks/run_all.py --only {file.rsplit('_np', 1)[0]} measures it")
        with open(self.path, newline="") as handle:
            self.rows = list(csv.DictReader(handle))

    def where(self, **values):
        return [row for row in self.rows if all(row.get(column, "") == str(value) for column, value in values.items())]

    def number(self, column, **values) -> Optional[float]:
        """`column` of the one row that has `values`, as a float; None where no row has them."""
        cells = [row[column] for row in self.where(**values) if row.get(column)]
        return float(cells[0]) if cells else None

    def samples(self, model, run):
        return self.number("samples_per_s", model=model, run=run, baseline="")

    def ratio(self, model, run, baseline):
        return self.number("ratio", model=model, run=run, baseline=baseline)

    def models(self, order):
        present = {row.get("model") for row in self.rows}
        return [model for model in order if model in present]

    def context(self, column):
        """The distinct values of `column`, in file order."""
        return list(dict.fromkeys(row.get(column) or "" for row in self.rows))


class Table(NamedTuple):
    files: Tuple[str, ...]  # under benchmarks/results/; empty for the machine table: its page's files
    render: Callable[..., str]  # a Results per file -> the markdown above the "Measured" line
    # Measured in containers, whose MPI and frameworks the table names itself: its files stay
    # out of its page's machine table.
    own_machine: bool = False


# Numbers as the docs write them; an empty cell where the CSV file has no value.

def _optional(format_value):
    return lambda value: "" if value is None else format_value(value)


rate = _optional(lambda samples: f"{samples:.0f}" if samples >= 1000 else f"{samples:.1f}")
fraction = _optional(lambda value: f"{value:.2f}")
times = _optional(lambda value: f"{value:.2f}x" if value >= 1 else f"{value:#.2g}x")


@_optional
def duration(seconds):
    """Three significant digits in µs, ms or s."""
    seconds = float(f"{seconds:.3g}")
    unit, scale = next(((unit, scale) for unit, scale in (("s", 1), ("ms", 1e-3)) if seconds >= scale), ("µs", 1e-6))
    return f"{seconds / scale:#.3g}".rstrip(".") + f" {unit}"


@_optional
def bandwidth(gigabytes_per_second):
    return f"{gigabytes_per_second:#.3g}".rstrip(".") + " GB/s"


def size(nbytes):
    nbytes = int(float(nbytes))
    unit, scale = next((unit, scale) for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024), ("B", 1))
                       if nbytes >= scale and nbytes % scale == 0)
    return f"{nbytes // scale} {unit}"


def each_run(row):
    """A driver's row's `runs` (median_rows), as durations."""
    return ", ".join(duration(float(seconds)) for seconds in row["runs"].split(";"))


def markdown_table(header, rows):
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


# The tables.

ENGINE_LABELS = {
    "engine": "{tensors} tensors × {elements} float32 through the engine, async + synchronize",
    "engine, grouped": "the same as one grouped all-reduce through the engine",
    "engine, no cache": "{tensors} tensors through the engine, response cache off",
    "raw separate": "{tensors} separate raw `Comm.Allreduce` calls",
    "raw concatenated": "raw concatenated: one `Allreduce` of all {tensors}",
    "lone engine": "lone {bytes} `hvd.allreduce`",
    "lone raw": "lone {bytes} raw `Comm.Allreduce`",
    "compute loop beside an idle engine": "numpy compute loop beside an idle engine",
    "compute loop without hvdplus": "the same loop without hvdplus",
}


def engine(results):
    def label(row):
        elements = int(row["elements"] or 0)
        thousands = f"{elements // 1000}k" if elements >= 1000 and elements % 1000 == 0 else str(elements)
        return ENGINE_LABELS.get(row["measurement"], row["measurement"]).format(
            tensors=row["tensors"], elements=thousands, bytes=size(4 * elements) if elements else "")

    def against(row):
        if not row["baseline"] or row["baseline"] == row["measurement"]:
            return ""
        return f"{times(float(row['seconds_over_baseline']))} {row['baseline']}"

    return markdown_table(["per step", "time", "against"],
                          [[label(row), duration(float(row["seconds"])), against(row)] for row in results.rows])


COLLECTIVE_METHODS = ("raw MPI", "hvdplus engine (auto)", "direct auto", "direct shm", "direct ring",
                      "direct hierarchical", "direct mpi", "torch gloo", "memcpy (1 core)")
# The methods whose bus bandwidth the table gives where sizes are large enough to be bandwidth-bound.
BANDWIDTH_METHODS, BANDWIDTH_FROM_BYTES = ("raw MPI", "hvdplus engine (auto)", "memcpy (1 core)"), 64 * MIB


def collectives(results):
    found = results.context("method")
    methods = [method for method in COLLECTIVE_METHODS if method in found]
    methods += [method for method in found if method not in methods]

    def cell(nbytes, method):
        row = results.where(bytes=nbytes, method=method)
        if not row:
            return ""
        row = row[0]
        text = duration(float(row["seconds"]))
        if method in BANDWIDTH_METHODS and float(nbytes) >= BANDWIDTH_FROM_BYTES:
            text += f", {bandwidth(float(row['busbw_GBps']))}"
        if row["ratio_to_raw_mpi"] and method != "raw MPI":
            text += f" ({times(float(row['ratio_to_raw_mpi']))})"
        return text

    return markdown_table(["size"] + [method.removeprefix("hvdplus ") for method in methods],
                          [[size(nbytes)] + [cell(nbytes, method) for method in methods]
                           for nbytes in results.context("bytes")])


def samples_of(run):
    return lambda results, model: rate(results.samples(model, run))


def ratio_of(run, baseline, form=times):
    return lambda results, model: form(results.ratio(model, run, baseline))


def column(name):
    return lambda results, model: results.where(model=model)[0][name]


def rows_per_model(sources, labels, columns):
    """[label, cells...] per model of each (Results, row label prefix) in `sources`, in `labels`' order."""
    return [[f"{prefix}{labels[model]}"] + [cell(results, model) for cell in columns]
            for results, prefix in sources for model in results.models(labels)]


# The models' names in the CSV files, and what they are (benchmarks/torch_training.py, benchmarks/keras_models.py).
TORCH_MODELS = {"cnn": "ResNet-style CNN", "mlp": "MLP 24 × 256"}
KERAS_MODELS = {"cnn": "ResNet-style CNN", "mlp": "MLP 8 × 256"}


def torch_training(results):
    header = ["model", "batch per rank", "steps per round", "hvdplus", "DDP gloo", "mpi4py loop", "independent ranks",
              "one rank", "efficiency", "vs DDP", "vs mpi4py loop"]
    columns = [column("batch_per_rank"), column("steps"), samples_of("hvdplus"), samples_of("DDP gloo"),
               samples_of("mpi4py loop"), samples_of("independent ranks"), samples_of("one rank alone"),
               ratio_of("hvdplus", "independent ranks", fraction), ratio_of("hvdplus", "DDP gloo"),
               ratio_of("hvdplus", "mpi4py loop")]
    return markdown_table(header, rows_per_model([(results, "")], TORCH_MODELS, columns))


# The runs of benchmarks/tensorflow_training.py, named by their letters there.
A, B, C, D, E, F, G = ("(a) MirroredStrategy fit + hvdplus", "(b) DistributedGradientTape",
                       "(c) MultiWorkerMirroredStrategy", "(d) independent ranks", "(e) one process alone",
                       "(f) mpi4py loop", "(g) independent model.fit")


def tensorflow_training(results):
    def pair(first, second):
        return lambda results, model: ", ".join(cell(results, model) for cell in (first, second))

    def alone_step(results, model):
        alone = results.samples(model, E)
        return duration(float(column("batch_per_rank")(results, model)) / alone if alone else None)

    rows = [
        ("batch per process", column("batch_per_rank")), ("steps per round", column("steps")),
        ("(a) `model.fit` + `hvd.CrossDeviceOps()`", samples_of(A)), ("(b) `DistributedGradientTape`", samples_of(B)),
        ("(f) mpi4py loop in `tf.numpy_function`", samples_of(F)), ("(g) independent `model.fit`", samples_of(G)),
        ("(c) MultiWorkerMirroredStrategy", samples_of(C)), ("(d) independent processes", samples_of(D)),
        ("(e) one process alone", samples_of(E)), ("a step of (e) one process alone", alone_step),
        ("efficiency (b)/(d)", ratio_of(B, D, fraction)),
        ("efficiency (a)/(d), (a)/(g)", pair(ratio_of(A, D, fraction), ratio_of(A, G, fraction))),
        ("(a), (b) against (c)", pair(ratio_of(A, C), ratio_of(B, C))),
        ("(b) against (f)", ratio_of(B, F)),
    ]
    models = results.models(("mlp", "cnn"))
    table = markdown_table(["variant"] + [KERAS_MODELS[model] for model in models],
                           [[label] + [cell(results, model) for model in models] for label, cell in rows])
    failures = [f"(c) failed on {KERAS_MODELS.get(row['model'], row['model'])}: {row['failure']}"
                for row in results.rows if row.get("failure")]
    return "\n\n".join([table] + failures)


def keras_training(*backends):
    header = ["backend, model", "batch per rank", "hvdplus", "mpi4py loop", "independent ranks", "one rank",
              "efficiency", "vs mpi4py loop"]
    columns = [column("batch_per_rank"), samples_of("hvdplus"), samples_of("mpi4py loop"),
               samples_of("independent ranks"), samples_of("one rank alone"),
               ratio_of("hvdplus", "independent ranks", fraction), ratio_of("hvdplus", "mpi4py loop")]
    sources = [(results, results.file.removeprefix("keras_training_").rsplit("_np", 1)[0] + ", ")
               for results in backends]
    return markdown_table(header, rows_per_model(sources, KERAS_MODELS, columns))


def autotune(results):
    def repeat_row(repeat):
        measured = results.where(repeat=repeat)
        chosen = next(row for row in measured if row["chosen"] == "True")
        grid = sorted((row for row in measured if row["chosen"] != "True"), key=lambda row: float(row["rank"]))
        best, worst = float(grid[0]["samples_per_s"]), float(grid[-1]["samples_per_s"])
        tuning = f"{chosen['tuning_steps']} steps, {float(chosen['tuning_seconds']):.1f} s"
        return [repeat, f"{chosen['setting']} ({tuning})", rate(float(chosen["samples_per_s"])),
                f"{grid[0]['setting']}: {rate(best)}",
                f"{grid[-1]['setting']}: {rate(worst)} ({worst / best:.3f})",
                f"{chosen['rank']} of {len(measured)}", f"{float(chosen['ratio_to_best']):.3f}"]

    repeats = [repeat for repeat in results.context("repeat") if repeat]
    spread = {row["statistic"]: row for row in results.rows if row.get("statistic")}
    names = ("min", "median", "max")
    rows = [repeat_row(repeat) for repeat in repeats]
    if all(name in spread for name in names):
        rows.append([f"{' / '.join(names)} over {len(repeats)}", "", "", "", "",
                     " / ".join(f"{float(spread[name]['rank']):g}" for name in names),
                     " / ".join(f"{float(spread[name]['ratio_to_best']):.3f}" for name in names)])
    header = ["repeat", "chosen (tuned in)", "chosen, samples/s", "best of the grid", "worst of the grid (/ best)",
              "rank of the chosen", "chosen / best"]
    return markdown_table(header, rows)


def elastic(results):
    recovery = [[row["path"], duration(float(row["seconds"])), f"{float(row['steps_lost']):g}",
                 each_run(row)]
                for row in results.where(measurement="kill to first step")]
    commits = [[row["run"], fraction(float(row["ratio"]))] for row in results.where(baseline="no commits")]
    return "\n\n".join([
        markdown_table(["path", "kill to first step (median)", "steps lost (median)", "each run"], recovery),
        markdown_table(["commits of the deep MLP's TorchState, in an elastic job", "throughput against no commits"],
                       commits)])


def _code_then_words(way):
    """`hvdplus.run`: with a 200 MB argument, from "hvdplus.run: with a 200 MB argument"."""
    code, colon, words = way.partition(": ")
    return f"`{code}`{colon}{words}"


def startup(results):
    return markdown_table(["started by", "seconds (median)", "each run"],
                          [[row["way"] if row["way"].startswith("mpirun") else _code_then_words(row["way"]),
                            duration(float(row["seconds"])), each_run(row)]
                           for row in results.rows])


def waiting(results):
    """Each wait's processor share over a late peer's wait, and how late it notices the peer."""
    lateness = [column[len("overshoot_us_late_"):] for column in results.rows[0] if column.startswith("overshoot_us_")]
    return markdown_table(
        ["wait", f"processor time over a {float(results.rows[0]['late_s']):g} s wait",
         *(f"returns after a peer {late} late" for late in lateness)],
        [[row["wait"], f"{100 * float(row['cpu_share']):.1f} %",
          *(duration(float(row[f"overshoot_us_late_{late}"]) / 1e6) for late in lateness)] for row in results.rows])


def balance(*sources):
    """The load balancer against equal batches with one rank slowed, per job size."""
    def cell(results, measure, render):
        rows = results.where(measure=measure)
        return render(rows[0]) if rows else ""

    def percent(value):
        return f"{100 * float(value):.1f} %"

    lines = [
        ("samples/s: equal batches, balanced, ideal (the ranks' speeds summed)",
         "throughput", lambda row: " / ".join(rate(float(row[column])) for column in
                                              ("equal_samples_s", "balanced_samples_s", "ideal_samples_s")), ""),
        ("throughput, balanced over equal batches", "throughput",
         lambda row: times(float(row["balanced_over_equal"])), "at least 1.3x"),
        ("throughput, balanced over the ideal", "throughput",
         lambda row: fraction(float(row["balanced_over_ideal"])), "at least 0.9"),
        ("local batch sizes, balanced", "throughput", lambda row: row["sizes"], ""),
        ("the ceiling: sizes fixed from the ranks' known speeds (samples/s, over the ideal)", "throughput",
         lambda row: f"{rate(float(row['known_sizes_samples_s']))} ({fraction(float(row['known_sizes_over_ideal']))})"
         if row.get("known_sizes_samples_s") else "", ""),
        ("throughput, balanced over that ceiling", "throughput",
         lambda row: fraction(float(row["balanced_over_known_sizes"])) if row.get("balanced_over_known_sizes")
         else "", ""),
        ("steps to adapt once the rank turns slow (its size before, after)", "adapt",
         lambda row: f"{row['steps_to_adapt']} ({row['size_before']}, {float(row['size_settled']):g})", "at most 10"),
        ("digits test accuracy: equal batches, balanced", "digits",
         lambda row: f"{percent(row['accuracy_equal'])} / {percent(row['accuracy_balanced'])}", "within 0.5 points"),
        ("pipeline step: layers per stage by count, by time", "pipeline",
         lambda row: f"{duration(float(row['step_s_by_count']))} ({row['stage_layers_by_count']}), "
                     f"{duration(float(row['step_s_by_time']))} ({row['stage_layers_by_time']})", ""),
        ("pipeline, split by time over split by count", "pipeline",
         lambda row: times(float(row["time_over_count_speedup"])), "at least 1.3x"),
    ]
    header = ["with the last rank slowed " + times(float(sources[0].rows[0]["slowdown"])),
              *(f"{results.rows[0]['ranks']} ranks" for results in sources), "goal"]
    return markdown_table(header, [[label, *(cell(results, measure, render) for results in sources), goal]
                                   for label, measure, render, goal in lines])


def regimes(results):
    """Each regime's throughput at each link rate, its bytes on the wire per sample at the
    slowest, and its accuracy on the digits; then the goals' ratios."""
    speed = results.where(measurement="throughput")
    rates = sorted({float(row["link_gbit"]) for row in speed}, reverse=True)
    slowest = min(rates)

    def at(regime, gbit, column):
        rows = [row for row in speed if row["way"] == regime and float(row["link_gbit"]) == gbit]
        return float(rows[0][column]) if rows else None

    def link(gbit):
        return f"{gbit:g} Gbit/s" if gbit >= 1 else f"{gbit * 1000:g} Mbit/s"

    sync = at("synchronous", slowest, "samples_per_s")
    accuracy = {row["way"]: (float(row["accuracy"]), row["steps"]) for row in results.where(measurement="accuracy")}
    steps = next(iter(accuracy.values()))[1] if accuracy else ""
    regime_names = list(dict.fromkeys(row["way"] for row in speed))
    table = markdown_table(
        ["regime", *(f"samples/s at {link(gbit)}" for gbit in rates), f"over synchronous at {link(slowest)}",
         f"bytes sent per sample at {link(slowest)}", f"digits accuracy after {steps} steps"],
        [[regime, *(rate(at(regime, gbit, "samples_per_s")) for gbit in rates),
          times(at(regime, slowest, "samples_per_s") / sync),
          f"{at(regime, slowest, 'bytes_sent_per_sample'):,.0f}",
          f"{100 * accuracy[regime][0]:.1f} %" if regime in accuracy else ""] for regime in regime_names])
    fast = at("local SGD H=16", slowest, "samples_per_s")
    anchor = at("torch post-local SGD H=16", slowest, "samples_per_s")
    worst = max(abs(value - accuracy["synchronous"][0]) for value, _ in accuracy.values()) if accuracy else None
    goals = markdown_table(["goal", "measured"], [
        [f"local SGD H=16 over synchronous at {link(slowest)}: at least 5x", times(fast / sync)],
        [f"local SGD H=16 over torch's post-local SGD H=16 at {link(slowest)}: at least 1x", times(fast / anchor)],
        ["every regime's accuracy within 1 point of synchronous",
         "" if worst is None else f"{100 * worst:.1f} points at most"]])
    model = f"An MLP of {int(speed[0]['parameters']):,} parameters, {results.rows[0]['ranks']} ranks on as many hosts."
    return "\n\n".join([machine(results), model, table, goals])


def ray_recovery(results):
    return markdown_table(["job", "ray.kill to the next step done (median)", "each run"],
                          [[row["way"], duration(float(row["seconds"])), each_run(row)] for row in results.rows])


def spark(results):
    return markdown_table(["measurement", "job", "seconds (median)", "each run"],
                          [[row["measurement"], f"`{row['way']}`" if row["way"].startswith(("hvdplus", "Torch"))
                            else row["way"], duration(float(row["seconds"])), each_run(row)]
                           for row in results.rows])


def slurm(results):
    """The machine and the containers' versions; then each way's time from sbatch to the first
    collective, against the peer's (torchrun); then SIGUSR1's to a commit and to a requeue."""
    started = results.where(measurement="sbatch to first collective")
    peer = next(float(row["seconds"]) for row in started if row["way"].startswith("torchrun"))
    first = markdown_table(["started by", "sbatch to first collective (median)", "against torchrun's time", "each run"],
                           [[row["way"], duration(float(row["seconds"])),
                             "" if row["way"].startswith("torchrun") else times(float(row["seconds"]) / peer),
                             each_run(row)] for row in started])
    signal = markdown_table(["SIGUSR1 to", "seconds (median)", "each run"],
                            [[row["way"], duration(float(row["seconds"])), each_run(row)]
                             for row in results.where(measurement="SIGUSR1 to")])
    return "\n\n".join([machine(results), first, signal])


# The size whose all-reduce README quotes: large enough to be bandwidth-bound (or the largest measured below it).
SUMMARY_BYTES = 64 * MIB


def command_of(results):
    return f"`{results.context('command')[0]}`"


def training_summary(results, labels, run, alone, peer, peer_label):
    """README's rows of one training benchmark: `run`'s samples/s, its efficiency against `alone`
    and its ratio to `peer`, per model; the command in the first."""
    against = ratio_of(run, peer)
    columns = [samples_of(run), ratio_of(run, alone, fraction),
               lambda results, model: f"{against(results, model)} {peer_label}"]
    rows = rows_per_model([(results, "")], labels, columns)
    return [[command_of(results) if index == 0 else ""] + row for index, row in enumerate(rows)]


def latency_summary(results):
    """README's row of the engine benchmark: a lone small all-reduce against raw MPI's."""
    lone, raw = (results.where(measurement=name)[0] for name in ("lone engine", "lone raw"))
    return [command_of(results), f"lone {size(4 * int(lone['elements']))} all-reduce", duration(float(lone["seconds"])),
            "", f"{times(float(lone['seconds_over_baseline']))} the latency of raw `Comm.Allreduce` "
                f"({duration(float(raw['seconds']))})"]


def bandwidth_summary(results):
    """README's row of the collectives benchmark: a large all-reduce through the engine against raw MPI's."""
    nbytes = max(results.context("bytes"), key=lambda nbytes: (float(nbytes) <= SUMMARY_BYTES, float(nbytes)))
    fused, raw = (results.where(bytes=nbytes, method=name)[0] for name in ("hvdplus engine (auto)", "raw MPI"))
    return [command_of(results), f"{size(nbytes)} all-reduce through the engine",
            f"{duration(float(fused['seconds']))}, {bandwidth(float(fused['busbw_GBps']))} busbw", "",
            f"{times(float(fused['ratio_to_raw_mpi']))} the speed of raw `Comm.Allreduce` "
            f"({duration(float(raw['seconds']))})"]


def summary(torch_results, tensorflow_results, *rest):
    """README's table: hvdplus' headline numbers from each benchmark, with the command that
    measured them: torch, TensorFlow, Keras on each backend, the engine, the collectives."""
    *keras_backends, engine_results, collectives_results = rest
    tape = {model: f"{label}, `DistributedGradientTape`" for model, label in KERAS_MODELS.items()}
    rows = (training_summary(torch_results, TORCH_MODELS, "hvdplus", "independent ranks", "DDP gloo", "DDP (gloo)")
            + training_summary(tensorflow_results, tape, B, D, C, "MultiWorkerMirroredStrategy"))
    for keras_results in keras_backends:
        rows += training_summary(keras_results, KERAS_MODELS, "hvdplus", "independent ranks", "mpi4py loop",
                                 "mpi4py loop")
    rows += [latency_summary(engine_results), bandwidth_summary(collectives_results)]
    sources = (torch_results, tensorflow_results, *keras_backends, engine_results, collectives_results)
    header = ["benchmark (command)", "model", "hvdplus", "efficiency", "against"]
    return machine(*sources) + "\n\n" + markdown_table(header, rows)


def machine(*sources):
    """One sentence: the machines, MPI libraries and frameworks of `sources`' rows, each once."""
    def distinct(values):
        return "; ".join(dict.fromkeys(values))

    hosts = distinct(text.split(": ", 1)[-1] for results in sources for text in results.context("machine"))
    mpis = distinct(text.split(",")[0] for results in sources for text in results.context("mpi"))
    libraries = [[name.strip() for name in text.split(",")] for results in sources
                 for text in results.context("framework_versions")]
    everywhere = set.intersection(*(set(names) for names in libraries)) if libraries else set()
    ordered = list(dict.fromkeys(name for names in libraries for name in names if name not in everywhere))
    ordered += [name for name in libraries[0] if name in everywhere] if libraries else []
    ranks = distinct(rank for results in sources for rank in results.context("ranks"))
    return f"Run on {hosts}, with {mpis}; {', '.join(ordered)}; {ranks} ranks."


BREAKDOWN_WAYS = ("compute", "bridge", "bridge + lock-step", "bridge + raw MPI", "hvdplus")


def keras_breakdown(*backends):
    """Per backend, each way's milliseconds per step, what it adds to the way before, and its
    efficiency against compute alone."""
    rows = []
    for results in backends:
        backend = results.file[len("keras_breakdown_"):].rsplit("_np", 1)[0]
        cells = []
        for way in BREAKDOWN_WAYS:
            ms = results.number("ms_per_step", way=way)
            added = results.number("ms_added", way=way)
            step = "" if ms is None else f"{ms:.2f} ms" + ("" if added is None else f" ({added:+.2f})")
            cells.append(f"{step}, {fraction(results.number('efficiency', way=way))}")
        rows.append([backend, *cells])
    return markdown_table(["Keras backend", *(f"{way}: ms/step (added), efficiency" for way in BREAKDOWN_WAYS)],
                          rows)


COMPARE_VALUES = {"base_median", "head_median", "head_worse_by", "value"}
COMPARE_CONTEXT = {"base_commit", "commit", "turns", "ranks", "date", "machine", "mpi", "hvdplus_version",
                   "framework_versions", "command"}


def compare(*sources):
    """Old against new (benchmarks/compare_commits.py): each measurement's medians at both
    commits, and how much slower the new one is."""
    rows = []
    for results in sources:
        benchmark = results.file[len("compare_"):].rsplit("_np", 1)[0]
        for row in results.rows:
            label = ", ".join(value for column, value in row.items()
                              if column not in COMPARE_VALUES | COMPARE_CONTEXT and value)
            show = duration if row["value"] == "seconds" else rate
            rows.append([f"`{benchmark}` at `{row['base_commit']}` against `{row['commit']}`", label,
                         show(float(row["base_median"])), show(float(row["head_median"])),
                         f"{float(row['head_worse_by']):.3f}x"])
    return markdown_table(["benchmark: old against new", "measurement", "old (median)", "new (median)",
                           "new slower by"], rows)


def measured(*sources):
    """The closing line of a table: when and at which commit each of its files was measured."""
    def commit(results):
        commits = [value for value in results.context("commit") if value]
        if not commits:
            return "at a commit the file does not record"
        return "at an unknown commit" if commits == ["unknown"] else "at commit " + ", ".join(f"`{c}`" for c in commits)

    groups = {}
    for results in sources:
        day = ", ".join(sorted({date[:10] for date in results.context("date")}))
        groups.setdefault((day, commit(results)), []).append(f"`benchmarks/results/{results.file}`")
    return "Measured " + "; ".join(f"{day} {at}: {', '.join(files)}" for (day, at), files in groups.items()) + "."


TABLES = {
    MACHINE: Table((), machine),
    "engine": Table(("engine_np2.csv",), engine),
    "collectives": Table(("collectives_np2.csv",), collectives),
    "torch_training": Table(("torch_training_np2.csv",), torch_training),
    "tensorflow_training": Table(("tensorflow_training_np2.csv",), tensorflow_training),
    "keras_training": Table(("keras_training_torch_np2.csv", "keras_training_tensorflow_np2.csv",
                             "keras_training_jax_np2.csv"), keras_training),
    "autotune": Table(("autotune_np2.csv",), autotune),
    "elastic": Table(("elastic_np2.csv",), elastic),
    "startup": Table(("startup_np2.csv",), startup),
    "ray_recovery": Table(("ray_recovery_np2.csv",), ray_recovery),
    "regimes": Table(("regimes_np2.csv",), regimes, own_machine=True),
    "waiting": Table(("waiting_np2.csv",), waiting),
    "balance": Table(("balance_np2.csv", "balance_np4.csv"), balance),
    "spark": Table(("spark_np2.csv",), spark),
    "slurm": Table(("slurm_np3.csv",), slurm, own_machine=True),
    "keras_breakdown": Table(("keras_breakdown_tensorflow_np2.csv", "keras_breakdown_jax_np2.csv",
                              "keras_breakdown_torch_np2.csv"), keras_breakdown),
    "compare": Table(("compare_engine_np2.csv", "compare_collectives_np2.csv", "compare_torch_training_np2.csv"),
                     compare),
    "summary": Table(("torch_training_np2.csv", "tensorflow_training_np2.csv", "keras_training_torch_np2.csv",
                      "keras_training_tensorflow_np2.csv", "keras_training_jax_np2.csv", "engine_np2.csv",
                      "collectives_np2.csv"), summary),
}


def render(name, files=None, directory=RESULTS):
    """The markdown between the markers of table `name`: the table, then its "Measured" line.
    `files` replaces the table's own (the machine table takes its page's)."""
    if name not in TABLES:
        raise KeyError(f"no table named {name!r}; tables: {', '.join(TABLES)}")
    table = TABLES[name]
    sources = [Results(file, directory) for file in (files if files is not None else table.files)]
    text = machine(*sources) if name == MACHINE else f"{table.render(*sources)}\n\n{measured(*sources)}"
    return f"\n{text}\n\n"  # blank lines, so that markdown reads the markers and the table as blocks of their own


def render_document(text, directory=RESULTS):
    """`text` with every marked table rendered anew."""
    names = [match.group(2) for match in MARKED.finditer(text)]
    page_files = list(dict.fromkeys(file for name in names if name in TABLES and not TABLES[name].own_machine
                                    for file in TABLES[name].files))
    return MARKED.sub(lambda match: match.group(1) + render(match.group(2), page_files if match.group(2) == MACHINE
                                                            else None, directory) + match.group(4), text)


def stale_tables(documents=DOCUMENTS, directory=RESULTS, root=REPOSITORY):
    """(document, table name, unified diff) of each marked table whose text differs from its rendering."""
    stale = []
    for document in documents:
        with open(os.path.join(root, document)) as handle:
            text = handle.read()
        rendered = {match.group(2): match.group(3) for match in MARKED.finditer(render_document(text, directory))}
        for match in MARKED.finditer(text):
            name, written = match.group(2), match.group(3)
            if written != rendered[name]:
                diff = difflib.unified_diff(written.splitlines(), rendered[name].splitlines(), f"{document} (written)",
                                            f"{document} (from the CSV files)", lineterm="")
                stale.append((document, name, "\n".join(diff)))
    return stale


def rewrite(documents=DOCUMENTS, directory=RESULTS, root=REPOSITORY):
    """Render every marked table of `documents` in place; returns the names of those that changed."""
    changed = [f"{document}: results:{name}" for document, name, _ in stale_tables(documents, directory, root)]
    for document in documents:
        path = os.path.join(root, document)
        with open(path) as handle:
            text = handle.read()
        rendered = render_document(text, directory)
        if rendered != text:
            with open(path, "w") as handle:
                handle.write(rendered)
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a table differs from its CSV files, naming each")
    args = parser.parse_args()
    if args.check:
        stale = stale_tables()
        for document, name, diff in stale:
            print(f"{document}: table results:{name} differs from its CSV files\n{diff}\n")
        if stale:
            sys.exit(f"{len(stale)} table(s) out of date: python benchmarks/tables.py rewrites them")
        print(f"every generated table in {', '.join(DOCUMENTS)} matches its CSV files")
        return
    changed = rewrite()
    print("rewrote " + ", ".join(changed) if changed else "every generated table was up to date")


if __name__ == "__main__":
    main()
