"""The figures the docs show, drawn from the benchmarks' CSV files.

    python benchmarks/plot.py [--results benchmarks/results] [--out docs/img]

  collectives_np<ranks>.csv -> collectives_np<ranks>.png: all-reduce bus bandwidth, and
      speed against raw mpi4py `Comm.Allreduce`, by message size; a line per method the
      file holds (the engine, each algorithm called directly, the peers).
  torch_training_np<ranks>.csv, tensorflow_training_np<ranks>.csv and
  keras_training_<backend>_np<ranks>.csv -> training.png: a row of bars per file, on the
      left the scaling efficiencies (ratio rows against a run without communication:
      independent ranks, one rank alone), on the right hvdplus against its peers (ratio
      rows between two runs that both communicate).

A figure whose files are all missing is skipped, with a line saying so. engine_np<ranks>.csv
has no figure: its few numbers read better as the docs' table. Reads files only; needs
matplotlib, not MPI.
"""

import argparse
import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")  # files only, on machines without a display too
import matplotlib.pyplot as plt  # noqa: E402

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING_PATTERNS = ("torch_training_np*.csv", "tensorflow_training_np*.csv", "keras_training_*_np*.csv")
# Methods and runs that are not hvdplus: drawn dashed in the collectives figure.
PEER_PREFIXES = ("raw", "torch", "memcpy")
# Runs without communication: the baselines of scaling efficiency, never a peer.
BASELINE_WORDS = ("independent", "alone")


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def provenance(row):
    """The machine, MPI library and hvdplus a file's numbers come from, in one line."""
    return f"{row['machine']}; {row['mpi'].split(',')[0]}; hvdplus {row['hvdplus_version']}"


def plot_collectives(path, out_dir):
    rows = read_rows(path)
    figure, (bandwidth, speed) = plt.subplots(1, 2, figsize=(14, 5.5))
    for method in dict.fromkeys(row["method"] for row in rows):
        points = [row for row in rows if row["method"] == method]
        sizes = [int(row["bytes"]) for row in points]
        style = "--" if method.startswith(PEER_PREFIXES) else "-"
        line, = bandwidth.plot(sizes, [float(row["busbw_GBps"]) for row in points], style, marker="o",
                               label=method)
        if all(row["ratio_to_raw_mpi"] for row in points):
            speed.plot(sizes, [float(row["ratio_to_raw_mpi"]) for row in points], style, marker="o",
                       color=line.get_color(), label=method)
    speed.axhline(1.0, color="black", linewidth=0.8)
    sizes = sorted({int(row["bytes"]) for row in rows})
    for axis, label in ((bandwidth, "bus bandwidth (GB/s)"), (speed, "speed against raw mpi4py (x, above 1: faster)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sizes, [size_label(size) for size in sizes])
        axis.set_yscale("log")
        axis.set_xlabel("message size (float32)")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    bandwidth.legend(fontsize=8)
    figure.suptitle(f"all-reduce, {rows[0]['ranks']} ranks\n{provenance(rows[0])}; {rows[0]['date']}", fontsize=9)
    figure.tight_layout()
    return save(figure, out_dir, os.path.splitext(os.path.basename(path))[0] + ".png")


def size_label(size):
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def communication_free(run):
    return any(word in run for word in BASELINE_WORDS)


def ratio_bars(rows):
    """(efficiency rows, peer rows) of a training file: its ratio rows against a run without
    communication, and those between two runs that both communicate."""
    ratios = [row for row in rows if row["ratio"]]
    efficiency = [row for row in ratios if communication_free(row["baseline"])]
    peers = [row for row in ratios if not communication_free(row["baseline"]) and not communication_free(row["run"])]
    return efficiency, peers


def draw_bars(axis, rows, title, color):
    axis.set_title(title, fontsize=9, loc="left")
    if not rows:
        axis.text(0.5, 0.5, "none in this file", ha="center", va="center", transform=axis.transAxes)
        axis.set_xticks([])
        axis.set_yticks([])
        return
    labels = [f"{row['model']}: {row['run']} / {row['baseline']}" for row in rows]
    values = [float(row["ratio"]) for row in rows]
    positions = range(len(rows))
    axis.barh(positions, values, color=color)
    axis.axvline(1.0, color="black", linewidth=0.8)
    for position, value in zip(positions, values):
        axis.text(value, position, f" {value:.2f}", va="center", fontsize=7)
    axis.set_yticks(list(positions), labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(0, max(values + [1.0]) * 1.15)


def plot_training(paths, out_dir):
    tables = [read_rows(path) for path in paths]
    heights = [max(1, *map(len, ratio_bars(rows))) for rows in tables]
    figure, axes = plt.subplots(len(tables), 2, figsize=(16, 1.1 * len(tables) + 0.3 * sum(heights)),
                                gridspec_kw={"height_ratios": heights}, squeeze=False, layout="constrained")
    for rows, (left, right) in zip(tables, axes):
        efficiency, peers = ratio_bars(rows)
        first = rows[0]
        versions = first["framework_versions"].split(", mpi4py")[0]
        name = f"{first['benchmark']}, {first['ranks']} ranks ({versions}), {first['date'][:10]}"
        draw_bars(left, efficiency, f"{name}\nscaling efficiency", "tab:blue")
        draw_bars(right, peers, "\nagainst peers", "tab:green")
    machines = " | ".join(dict.fromkeys(provenance(rows[0]) for rows in tables))
    figure.suptitle(f"training: ratios of samples/s (above 1: the first run is faster)\n{machines}", fontsize=9)
    return save(figure, out_dir, "training.png")


def save(figure, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(REPOSITORY, "benchmarks", "results"),
                        help="folder of the benchmarks' CSV files")
    parser.add_argument("--out", default=os.path.join(REPOSITORY, "docs", "img"), help="folder for the PNG files")
    args = parser.parse_args()

    collectives = sorted(glob.glob(os.path.join(args.results, "collectives_np*.csv")))
    if not collectives:
        print(f"collectives: no collectives_np*.csv in {args.results}, skipped")
    for path in collectives:
        plot_collectives(path, args.out)
    training = []
    for pattern in TRAINING_PATTERNS:
        found = sorted(glob.glob(os.path.join(args.results, pattern)))
        if not found:
            print(f"training: no {pattern} in {args.results}, left out of training.png")
        training += found
    if training:
        plot_training(training, args.out)
    else:
        print("training: no training results, training.png skipped")


if __name__ == "__main__":
    main()
