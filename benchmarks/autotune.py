"""Autotuning against the best of the grid it searches: is the setting it chooses as fast?

    hvdplusrun -np 2 python benchmarks/autotune.py [--model mlp] [--csv PATH]

Trains the deep MLP of benchmarks/torch_training.py with hvdplus.torch's DistributedOptimizer
and HOROVOD_AUTOTUNE=1 until the tuner has chosen (hvdplus.engine.autotune). Then, in the
same job, measures the throughput of every setting of the grid the tuner searches (each
fusion threshold with each cycle time) and of the chosen one, in turns
(harness.interleaved_throughputs; each setting is applied on every rank between steps with
Engine.retune), and prints the chosen setting's throughput against the grid's best. Writes
benchmarks/results/autotune_np<ranks>.csv.
"""

import argparse
import itertools
import os
import time

os.environ["HOROVOD_AUTOTUNE"] = "1"  # before hvdplus reads its settings

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdplus.torch as hvd  # noqa: E402
from harness import add_csv_option, interleaved_throughputs, write_results  # noqa: E402
from hvdplus.engine import runtime  # noqa: E402
from hvdplus.engine.autotune import CYCLE_MS, FUSION_MIB, MIB, Setting  # noqa: E402
from torch_training import MODELS  # noqa: E402

WORLD = MPI.COMM_WORLD


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="mlp")
    parser.add_argument("--steps", type=int, default=20, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    add_csv_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
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

    grid = {Setting(mib * MIB, cycle, chosen.algorithm): f"{mib} MiB, {cycle:g} ms"
            for mib, cycle in itertools.product(FUSION_MIB, CYCLE_MS)}
    runs = {label: with_setting(setting) for setting, label in grid.items()}
    runs["chosen"] = with_setting(chosen)
    results = interleaved_throughputs(runs, batch, args.steps, rounds=args.rounds)
    best_label = max((label for label in results if label != "chosen"), key=results.get)
    ratio = results["chosen"] / results[best_label]
    if hvd.rank() == 0:
        print(f"tuned in {tuning_steps} steps ({tuning_seconds:.1f} s): {chosen.describe()}")
        for label, value in sorted(results.items(), key=lambda item: -item[1]):
            print(f"  {label:18s} {value:10.1f} samples/s")
        print(f"chosen / best of the grid ({best_label}): {ratio:.3f} (target >= 0.95)")
    rows = [{"model": args.model, "setting": label, "samples_per_s": value,
             "chosen": label == "chosen", "ratio_to_best": value / results[best_label]}
            for label, value in results.items()]
    rows.append({"model": args.model, "setting": f"tuning: {chosen.describe()}", "tuning_steps": tuning_steps,
                 "tuning_seconds": tuning_seconds})
    write_results("autotune", rows, {"torch": torch.__version__}, args.csv)
    hvd.shutdown()


if __name__ == "__main__":
    main()
