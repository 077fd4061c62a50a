"""Engine overhead against raw mpi4py, measured side by side in one run.

    hvdplusrun -np 2 python benchmarks/engine.py

Prints, per step: 200 tensors of 10k float32 all-reduced through the engine (async submit
of all, then synchronize), as 200 separate raw `Comm.Allreduce` calls, and as one raw
`Allreduce` of their concatenation; the same with the response cache off; a lone 4 KiB
all-reduce through the engine against raw `Allreduce`; and what an idle engine costs a
compute loop running beside it.
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=30)
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
    idle_without_engine = statistics.mean(idle["without"])
    idle_with_engine = statistics.mean(idle["beside"])
    hvd.init()
    results = {}
    results["engine"] = timed(engine_step(tensors), args.repeats)
    results["raw separate"] = timed(raw_separate_step(tensors, comm), args.repeats)
    results["raw concatenated"] = timed(raw_concatenated_step(tensors, comm), args.repeats)
    results["lone engine"] = timed(lambda: hvd.allreduce(lone, op=hvd.Sum, name="lone"), 300)
    results["lone raw"] = timed(lambda: comm.Allreduce(lone, lone_out, op=MPI.SUM), 300)
    hvd.shutdown()
    os.environ["HVDPLUS_CACHE_CAPACITY"] = "0"
    hvd.init()
    results["engine, no cache"] = timed(engine_step(tensors), args.repeats)
    hvd.shutdown()

    if MPI.COMM_WORLD.Get_rank() == 0:
        size = MPI.COMM_WORLD.Get_size()
        mb = args.tensors * args.elements * 4 / 1e6
        print(f"ranks {size}; step = {args.tensors} tensors x {args.elements} float32 ({mb:.1f} MB)")
        for label in ("engine", "engine, no cache", "raw separate", "raw concatenated"):
            ratio = results[label] / results["raw concatenated"]
            print(f"  {label:18s} {results[label] * 1e3:8.3f} ms/step   {ratio:5.2f}x raw concatenated")
        print(f"  response cache saves {(results['engine, no cache'] / results['engine'] - 1) * 100:5.1f}% per step")
        lone_ratio = results["lone engine"] / results["lone raw"]
        print(f"lone 4 KiB allreduce: engine {results['lone engine'] * 1e6:7.1f} us, "
              f"raw {results['lone raw'] * 1e6:6.1f} us, {lone_ratio:5.1f}x raw")
        overhead = (idle_with_engine / idle_without_engine - 1) * 100
        print(f"compute loop beside an idle engine: {idle_with_engine:.3f} s vs {idle_without_engine:.3f} s "
              f"without hvdplus ({overhead:+.1f}%)")


if __name__ == "__main__":
    main()
