"""Engine overhead against raw mpi4py, measured side by side in one run.

    hvdplusrun -np 2 python benchmarks/engine.py

Prints, per step: 200 tensors of 10k float32 all-reduced through the engine (async submit
of all, then synchronize), as one grouped all-reduce through the engine (what the framework
adapters submit for a step's gradients), as 200 separate raw `Comm.Allreduce` calls, and as
one raw `Allreduce` of their concatenation; the first with the response cache off; a lone 4 KiB
all-reduce through the engine against raw `Allreduce`; and what an idle engine costs a
compute loop running beside it. Each in seconds and against its baseline, as written to
benchmarks/results/engine_np<ranks>.csv (see harness.write_results).
"""

import argparse
import os
import statistics
import time

# The compute loop runs one BLAS thread per rank, as training does here (hvdplusrun's default,
# see runner/rank_threads): with every rank's BLAS threads on every core, any thread that
# wakes, hvdplus' or not, stalls them, and the comparison would measure that instead.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402  (after the thread count is set)
from mpi4py import MPI  # noqa: E402

import hvdplus as hvd  # noqa: E402
from harness import add_csv_option, write_results  # noqa: E402


def timed(step, repeats, warmup=3):
    """Median seconds of `step()` over `repeats` runs, every rank starting together."""
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(repeats):
        MPI.COMM_WORLD.Barrier()
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    # The slowest rank sets the pace of a data-parallel step.
    return MPI.COMM_WORLD.allreduce(statistics.median(samples), op=MPI.MAX)


def engine_step(tensors):
    def step():
        handles = [hvd.allreduce_async(t, name=f"grad.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)
    return step


def grouped_engine_step(tensors):
    def step():
        hvd.grouped_allreduce_async(tensors, name="grads", op=hvd.Sum).wait()
    return step


def raw_separate_step(tensors, comm):
    outputs = [np.empty_like(t) for t in tensors]
    def step():
        for t, out in zip(tensors, outputs):
            comm.Allreduce(t, out, op=MPI.SUM)
    return step


def raw_concatenated_step(tensors, comm):
    out = np.empty(sum(t.size for t in tensors), dtype=np.float32)
    def step():
        comm.Allreduce(np.concatenate(tensors), out, op=MPI.SUM)
    return step


def compute_loop(seconds_of_work=0.25):
    """A fixed amount of numpy work, timed: what training would do while the engine idles."""
    a = np.random.default_rng(0).random((256, 256))
    def step():
        b = a
        for _ in range(int(seconds_of_work * 400)):
            b = np.tanh(b @ a * 1e-3)
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=30)
    add_csv_option(parser)
    args = parser.parse_args()

    comm = MPI.COMM_WORLD.Dup()
    tensors = [np.random.default_rng(i).random(args.elements, dtype=np.float32) for i in range(args.tensors)]
    lone = np.ones(1024, dtype=np.float32)
    lone_out = np.empty_like(lone)

    # Alternate the compute loop without and beside an idle engine, so drift hits both alike.
    loop = compute_loop()
    idle = {"without": [], "beside": []}
    for _ in range(3):
        idle["without"].append(timed(loop, 3, warmup=1))
        hvd.init()
        time.sleep(0.05)
        idle["beside"].append(timed(loop, 3, warmup=1))
        hvd.shutdown()
    hvd.init()
    results = {"compute loop without hvdplus": statistics.mean(idle["without"]),
               "compute loop beside an idle engine": statistics.mean(idle["beside"])}
    results["engine"] = timed(engine_step(tensors), args.repeats)
    results["engine, grouped"] = timed(grouped_engine_step(tensors), args.repeats)
    results["raw separate"] = timed(raw_separate_step(tensors, comm), args.repeats)
    results["raw concatenated"] = timed(raw_concatenated_step(tensors, comm), args.repeats)
    results["lone engine"] = timed(lambda: hvd.allreduce(lone, op=hvd.Sum, name="lone"), 300)
    results["lone raw"] = timed(lambda: comm.Allreduce(lone, lone_out, op=MPI.SUM), 300)
    hvd.shutdown()
    os.environ["HVDPLUS_CACHE_CAPACITY"] = "0"
    hvd.init()
    results["engine, no cache"] = timed(engine_step(tensors), args.repeats)
    hvd.shutdown()

    rows = result_rows(results, args.tensors, args.elements, lone.size)
    if MPI.COMM_WORLD.Get_rank() == 0:
        mb = args.tensors * args.elements * 4 / 1e6
        print(f"ranks {MPI.COMM_WORLD.Get_size()}; step = {args.tensors} tensors x {args.elements} float32 "
              f"({mb:.1f} MB); lone = {lone.size} float32")
        for row in rows:
            against = f"{row['seconds_over_baseline']:6.2f}x {row['baseline']}" if row["baseline"] else ""
            print(f"  {row['measurement']:36s} {row['seconds'] * 1e3:10.4f} ms   {against}")
        print(f"  response cache saves {(results['engine, no cache'] / results['engine'] - 1) * 100:5.1f}% per step",
              flush=True)
    write_results("engine", rows, {}, args.csv)


def result_rows(results, tensors, elements, lone_elements):
    """One row per measurement of `results` ({label: seconds}): the tensors it all-reduces,
    and its seconds against the baseline it is compared with."""
    step, lone = (tensors, elements), (1, lone_elements)
    measurements = (
        ("engine", step, "raw separate"),
        ("engine, grouped", step, "raw separate"),
        ("engine, no cache", step, "raw separate"),
        ("raw separate", step, "raw concatenated"),
        ("raw concatenated", step, "raw concatenated"),
        ("lone engine", lone, "lone raw"),
        ("lone raw", lone, None),
        ("compute loop beside an idle engine", (None, None), "compute loop without hvdplus"),
        ("compute loop without hvdplus", (None, None), None),
    )
    return [{"measurement": label, "tensors": shape[0], "elements": shape[1], "seconds": results[label],
             "baseline": baseline,
             "seconds_over_baseline": results[label] / results[baseline] if baseline else None}
            for label, shape, baseline in measurements]


if __name__ == "__main__":
    main()
