"""All-reduce bandwidth of hvdplus' algorithms against raw MPI, gloo and memcpy, in one run.

    hvdplusrun -np 2 python benchmarks/collectives.py [--min-kib 4] [--max-kib 262144] [--csv PATH]

For each size from 4 KiB up: hvdplus through the engine (`hvd.allreduce`, auto algorithm),
the communication layer called directly with each algorithm and with auto, raw mpi4py
`Comm.Allreduce` on the same buffers, torch.distributed gloo `all_reduce` when torch is
installed, and single-core memcpy of the same bytes as the ceiling. Prints time, algbw and
busbw (busbw = algbw * 2(n-1)/n, as nccl-tests define it) with each ratio to raw MPI, and
writes them to benchmarks/results/collectives_np<ranks>.csv (see harness.write_results);
benchmarks/plot.py draws docs/img/collectives_np<ranks>.png from it.
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvdplus as hvd
from hvdplus.core import runtime
from harness import add_csv_option, init_gloo, write_results

WORLD = MPI.COMM_WORLD


def median_seconds(step, total_bytes):
    """Median over enough repeats to take about half a second (at least 3), slowest rank's."""
    step()
    WORLD.Barrier()
    start = time.perf_counter()
    step()
    once = WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    repeats = max(3, min(200, int(0.5 / max(once, 1e-6))))
    samples = []
    for _ in range(repeats):
        WORLD.Barrier()
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return WORLD.allreduce(statistics.median(samples), op=MPI.MAX)


def memcpy_seconds(data):
    """One core copying while the other ranks wait: the ceiling a single rank can move."""
    target = np.empty_like(data)
    result = 0.0
    if WORLD.Get_rank() == 0:
        np.copyto(target, data)
        samples = []
        for _ in range(max(3, min(100, int(2e8 // max(data.nbytes, 1))))):
            start = time.perf_counter()
            np.copyto(target, data)
            samples.append(time.perf_counter() - start)
        result = statistics.median(samples)
    return WORLD.bcast(result)


def measure(size_bytes, algorithm_names, gloo):
    count = size_bytes // 4
    data = np.random.default_rng(WORLD.Get_rank()).random(count, dtype=np.float32)
    out = np.empty_like(data)
    layer = runtime.current().algorithms
    rows = {"raw MPI": median_seconds(lambda: WORLD.Allreduce(data, out, op=MPI.SUM), size_bytes)}
    rows["hvdplus engine (auto)"] = median_seconds(lambda: hvd.allreduce(data, op=hvd.Sum, name="bench"), size_bytes)
    rows["direct auto"] = median_seconds(lambda: layer.allreduce(data, hvd.Sum), size_bytes)
    for algorithm in algorithm_names:
        rows[f"direct {algorithm}"] = median_seconds(
            lambda: layer.allreduce(data, hvd.Sum, algorithm=algorithm), size_bytes)
    if gloo is not None:
        import torch

        tensor = torch.from_numpy(data.copy())
        rows["torch gloo"] = median_seconds(lambda: gloo.all_reduce(tensor), size_bytes)
    rows["memcpy (1 core)"] = memcpy_seconds(data)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-kib", type=int, default=256 * 1024)
    add_csv_option(parser)
    args = parser.parse_args()

    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    single_node = runtime.current().algorithms.single_node
    algorithm_names = ["mpi", "ring", "hierarchical"] + (["shm"] if single_node and size > 1 else [])
    gloo = init_gloo(WORLD)
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    table = []
    sizes = []
    current = args.min_kib * 1024
    while current <= args.max_kib * 1024:
        sizes.append(current)
        current *= 4
    for size_bytes in sizes:
        rows = measure(size_bytes, algorithm_names, gloo)
        for method, seconds in rows.items():
            algbw = size_bytes / seconds / 1e9
            busbw = algbw * (factor if method != "memcpy (1 core)" else 1.0)
            table.append({"bytes": size_bytes, "method": method, "seconds": seconds,
                          "algbw_GBps": algbw, "busbw_GBps": busbw,
                          "ratio_to_raw_mpi": rows["raw MPI"] / seconds if method != "memcpy (1 core)" else None})
        if rank == 0:
            print(f"\n{size_bytes / 1024:>10.0f} KiB float32, {size} ranks")
            print(f"  {'method':24s} {'time us':>11s} {'algbw GB/s':>11s} {'busbw GB/s':>11s} {'x raw MPI':>10s}")
            for row in table[-len(rows):]:
                ratio = "" if row["ratio_to_raw_mpi"] is None else f"{row['ratio_to_raw_mpi']:10.2f}"
                print(f"  {row['method']:24s} {row['seconds'] * 1e6:11.1f} {row['algbw_GBps']:11.3f} "
                      f"{row['busbw_GBps']:11.3f} {ratio}", flush=True)
    frameworks = {}
    if gloo is not None:
        import torch

        frameworks["torch"] = torch.__version__
    write_results("collectives", table, frameworks, args.csv)
    hvd.shutdown()


if __name__ == "__main__":
    main()
