"""The tables of results in docs/performance.md and README.md against the CSV files under
benchmarks/results/: each table between `<!-- results:NAME -->` markers must be what
benchmarks/tables.py renders from those files, so that a table differs when a benchmark wrote new
results and nobody regenerated it, or when someone edited a number by hand. The fix for either
is `python benchmarks/tables.py`. Reads files only: one process, no MPI."""

import csv
import importlib.util
import os
import shutil
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPOSITORY, "benchmarks")


def load(name):
    """A module of benchmarks/, by path, under the bare name its scripts import it by."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


tables = load("tables")
run_all = load("run_all")


def test_every_generated_table_matches_its_csv_files():
    stale = tables.stale_tables()
    assert not stale, "tables that differ from their CSV files (python benchmarks/tables.py rewrites them):\n" + \
        "\n\n".join(f"{document}: results:{name}\n{diff}" for document, name, diff in stale)


def test_every_table_is_on_a_page():
    marked = set()
    for document in tables.DOCUMENTS:
        with open(os.path.join(REPOSITORY, document)) as handle:
            marked.update(match.group(2) for match in tables.MARKED.finditer(handle.read()))
    assert marked == set(tables.TABLES), f"tables on no page: {set(tables.TABLES) - marked}, " \
                                         f"markers naming no table: {marked - set(tables.TABLES)}"


def test_each_csv_file_records_the_command_run_all_runs():
    for benchmark in run_all.BENCHMARKS:
        found = run_all.recorded(benchmark)
        assert found is not None, f"benchmarks/results/{benchmark.results} is missing"
        assert found[2] == benchmark.command, (
            f"benchmarks/results/{benchmark.results} was measured with {found[2]!r}, but run_all.py runs "
            f"{benchmark.command!r}: python benchmarks/run_all.py --only {benchmark.name}")


def test_a_changed_result_makes_its_tables_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    path = results / "torch_training_np2.csv"
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    measured = next(row for row in rows if (row["model"], row["run"]) == ("cnn", "hvdplus") and row["samples_per_s"])
    measured["samples_per_s"] = str(2 * float(measured["samples_per_s"]))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    stale = {(document, name) for document, name, _ in tables.stale_tables(directory=str(results))}
    assert stale == {("docs/performance.md", "torch_training"), ("README.md", "summary")}
