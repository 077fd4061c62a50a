"""Autotuning against the grid it searches: where among the grid's settings does its choice rank?

    HOROVOD_AUTOTUNE=1 hvdplusrun -np 2 python benchmarks/autotune.py [--model mlp] [--repeats 3] [--csv PATH]

Trains the deep MLP of benchmarks/torch_training.py with hvdplus.torch's DistributedOptimizer
and HOROVOD_AUTOTUNE=1 until the tuner has chosen (hvdplus.engine.autotune). Then, in the
same job, measures the throughput of every setting of the grid the tuner searches (each
fusion threshold with each cycle time) and of the chosen one, in turns
(harness.interleaved_throughputs; each setting is applied on every rank between steps with
Engine.retune), and ranks the chosen setting's measurement among the grid's (1: faster than
every grid setting). The tuner measures a noisy machine, so one choice says little: the whole
of it, tuning included, repeats `--repeats` times, each time with a fresh engine (hvd.shutdown,
then hvd.init) and a fresh model, and the spread of the rank and of the ratio to the grid's
best across repeats is the result. The script sets HOROVOD_AUTOTUNE=1 itself. Writes
benchmarks/results/autotune_np<ranks>.csv.
"""

import argparse
import itertools
import os
import statistics
import time

os.environ["HOROVOD_AUTOTUNE"] = "1"  # before hvdplus reads its settings

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdplus.torch as hvd  # noqa: E402
from harness import add_csv_option, interleaved_throughputs, write_results  # noqa: E402
from hvdplus.core import runtime  # noqa: E402
from hvdplus.engine.autotune import CYCLE_MS, FUSION_MIB, MIB, Setting  # noqa: E402
from torch_training import MODELS  # noqa: E402

WORLD = MPI.COMM_WORLD
# Every row has every column, so that the measurement columns come before the context ones.
COLUMNS = ("model", "repeat", "setting", "chosen", "samples_per_s", "rank", "ratio_to_best", "tuning_steps",
           "tuning_seconds", "statistic")
CHOSEN = "chosen"


def label(setting):
    """A setting as the CSV's `setting` column names it: "64 MiB, 1 ms"."""
    algorithm = f", {setting.algorithm}" if setting.algorithm else ""
    return f"{setting.fusion_bytes / MIB:g} MiB, {setting.cycle_ms:g} ms{algorithm}"


def row(**values):
    return {column: values.get(column) for column in COLUMNS}


def tune_and_measure(args, repeat):
    """One repeat: a fresh engine tunes while the model trains, then the grid and the choice
    are measured in turns. Returns the repeat's rows, the chosen setting's row first."""
    hvd.init()
    build, make_input, batch = MODELS[args.model]
    torch.manual_seed(0)
    model = build()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters())
    data, target = make_input(batch), torch.randint(0, 10, (batch,))

    def run(steps):
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()

    engine = runtime.current().engine
    started, tuning_steps = time.perf_counter(), 0
    while not WORLD.bcast(engine.tuned_setting() is not None if hvd.rank() == 0 else None):
        run(5)
        tuning_steps += 5
    chosen = WORLD.bcast(engine.tuned_setting())
    tuning_seconds = time.perf_counter() - started

    def with_setting(setting):
        def run_with(steps):
            engine.retune(setting)  # no collective is in flight between steps
            run(steps)
        return run_with, hvd.size()

    grid = [Setting(mib * MIB, cycle, chosen.algorithm) for mib, cycle in itertools.product(FUSION_MIB, CYCLE_MS)]
    runs = {label(setting): with_setting(setting) for setting in grid}
    runs[CHOSEN] = with_setting(chosen)
    results = interleaved_throughputs(runs, batch, args.steps, rounds=args.rounds)
    hvd.shutdown()
    best = max(value for name, value in results.items() if name != CHOSEN)
    ranks = {name: place for place, name in enumerate(sorted(results, key=results.get, reverse=True), start=1)}
    rows = [row(model=args.model, repeat=repeat, setting=label(chosen), chosen=True, samples_per_s=results[CHOSEN],
                rank=ranks[CHOSEN], ratio_to_best=results[CHOSEN] / best, tuning_steps=tuning_steps,
                tuning_seconds=tuning_seconds)]
    rows += [row(model=args.model, repeat=repeat, setting=name, chosen=False, samples_per_s=value, rank=ranks[name],
                 ratio_to_best=value / best) for name, value in results.items() if name != CHOSEN]
    return rows


def spread_rows(model, chosen_rows):
    """The minimum, median and maximum of the chosen setting's rank and ratio to the best over
    the repeats, each column on its own (the best rank is the minimum, the worst ratio too)."""
    ranks = [chosen["rank"] for chosen in chosen_rows]
    ratios = [chosen["ratio_to_best"] for chosen in chosen_rows]
    return [row(model=model, setting=CHOSEN, chosen=True, statistic=name, rank=pick(ranks), ratio_to_best=pick(ratios))
            for name, pick in (("min", min), ("median", statistics.median), ("max", max))]


def report(repeat_rows, grid_size):
    chosen, *grid = repeat_rows
    print(f"repeat {chosen['repeat']}: tuned in {chosen['tuning_steps']} steps ({chosen['tuning_seconds']:.1f} s) "
          f"to {chosen['setting']}; its measurement ranks {chosen['rank']} of {grid_size + 1}, "
          f"{chosen['ratio_to_best']:.3f} of the grid's best (target >= 0.95)")
    for measured in sorted(repeat_rows, key=lambda measured: measured["rank"])[:3]:
        name = f"{measured['setting']}{' (chosen)' if measured['chosen'] else ''}"
        print(f"  {measured['rank']:2d}. {name:24s} {measured['samples_per_s']:10.1f} samples/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="mlp")
    parser.add_argument("--steps", type=int, default=20, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="times to tune and measure, each with a fresh engine")
    add_csv_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, chosen_rows = [], []
    for repeat in range(1, args.repeats + 1):
        repeat_rows = tune_and_measure(args, repeat)
        if WORLD.Get_rank() == 0:
            report(repeat_rows, len(repeat_rows) - 1)
        chosen_rows.append(repeat_rows[0])
        rows += repeat_rows
    rows += spread_rows(args.model, chosen_rows)
    if WORLD.Get_rank() == 0:
        for spread in rows[-3:]:
            print(f"{spread['statistic']:6s} over {args.repeats} repeats: rank {spread['rank']:g}, "
                  f"ratio to the best {spread['ratio_to_best']:.3f}")
    write_results("autotune", rows, {"torch": torch.__version__}, args.csv)


if __name__ == "__main__":
    main()
