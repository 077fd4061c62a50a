"""What waiting for a late peer costs, and how late the waiter notices it, against raw MPI.

    hvdplusrun -np 2 python benchmarks/waiting.py

The last rank arrives late; every other rank waits in one of hvdplus' waits or in MPI's own.
Two measurements per wait, each the median over `--repeats` rounds:

- `cpu_share`: the waiting process's processor time (every thread of it: the engine thread
  too) over the wall time it waited, with the last rank `--late-s` late (half a second by
  default). MPI's own waits spin, so raw `Allreduce` is the anchor: about one core.
- `overshoot_us`: for lateness of 0.2, 2, 20 and 200 ms, how long after the late rank's
  arrival the waiter returns, less what the same all-reduce takes when nobody is late.
  Both sides read CLOCK_MONOTONIC, which all processes on one machine share.

The waits: a 4 MiB all-reduce through the communication layer (`mpi` and `ring`, which wait
for every rank before moving a large buffer), a 4 KiB `hvd.allreduce` through the engine, a
point-to-point `hvd.recv`, and raw mpi4py `Allreduce` of 4 KiB and 4 MiB. Written to
benchmarks/results/waiting_np<ranks>.csv (see harness.write_results). The latency of a 4 KiB
all-reduce with nobody late is in engine.py's `lone engine` row.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402  (after the thread count is set)
from mpi4py import MPI  # noqa: E402

import hvdplus as hvd  # noqa: E402
from harness import add_csv_option, write_results  # noqa: E402

LATENESS_S = (0.0002, 0.002, 0.02, 0.2)


def waits(comm):
    """{name: wait(round) -> None}: each runs one collective (or receive) on every rank."""
    from hvdplus.core.runtime import current

    layer = current().algorithms
    large = np.ones((4 << 20) // 4, np.float32)
    large_out = np.empty_like(large)
    small = np.ones(1024, np.float32)
    small_out = np.empty_like(small)
    rank, last = comm.Get_rank(), comm.Get_size() - 1

    def p2p(round_):
        # Every rank but the last receives from it; the last sends to each.
        if rank == last:
            for peer in range(last):
                hvd.send(small, peer, tag=round_ % 1000)
        else:
            hvd.recv(small_out, last, tag=round_ % 1000)

    return {
        "layer mpi 4 MiB": lambda round_: layer.reduce(large, hvd.Sum, large_out, algorithm="mpi"),
        "layer ring 4 MiB": lambda round_: layer.reduce(large, hvd.Sum, large_out, algorithm="ring"),
        "engine 4 KiB": lambda round_: hvd.allreduce(small, op=hvd.Sum, name="waiting.small"),
        "p2p recv 4 KiB": p2p,
        "raw MPI Allreduce 4 KiB": lambda round_: comm.Allreduce(small, small_out, op=MPI.SUM),
        "raw MPI Allreduce 4 MiB": lambda round_: comm.Allreduce(large, large_out, op=MPI.SUM),
    }


def cpu_share(wait, comm, late_s, repeats):
    """Median over `repeats` of the waiting ranks' process time over wall time waited, with
    the last rank `late_s` late (the largest share among the waiting ranks)."""
    last = comm.Get_rank() == comm.Get_size() - 1
    shares = []
    for round_ in range(repeats):
        comm.Barrier()
        if last:
            time.sleep(late_s)
        wall, cpu = time.monotonic(), time.process_time()
        wait(round_)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        shares.append(0.0 if last else cpu / wall)
    return comm.allreduce(statistics.median(shares), op=MPI.MAX)


def overshoot_s(wait, comm, late_s, repeats):
    """Median over `repeats` of how long after the late rank's arrival the waiters return
    (the latest waiter), less the median of the same wait with nobody late."""
    last = comm.Get_rank() == comm.Get_size() - 1
    on_time, late = [], []
    for round_ in range(repeats):
        comm.Barrier()
        started = time.monotonic()
        wait(round_)
        on_time.append(time.monotonic() - started)
    for round_ in range(repeats):
        comm.Barrier()
        if last:
            time.sleep(late_s)
        arrived = time.monotonic()
        wait(round_)
        ended = time.monotonic()
        # The late rank's arrival time reaches the others after the wait, where it costs nothing.
        arrival = comm.bcast(arrived if last else None, root=comm.Get_size() - 1)
        late.append(ended - arrival)
    worst = comm.allreduce(statistics.median(late) if not last else 0.0, op=MPI.MAX)
    return max(0.0, worst - comm.allreduce(statistics.median(on_time), op=MPI.MAX))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late-s", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    add_csv_option(parser)
    args = parser.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for name, wait in waits(comm).items():
        row = {"wait": name, "cpu_share": cpu_share(wait, comm, args.late_s, args.repeats), "late_s": args.late_s}
        for late_s in LATENESS_S:
            row[f"overshoot_us_late_{late_s * 1e3:g}ms"] = overshoot_s(wait, comm, late_s, args.repeats) * 1e6
        rows.append(row)
        if comm.Get_rank() == 0:
            overshoots = "  ".join(f"{row[f'overshoot_us_late_{s * 1e3:g}ms']:8.1f}" for s in LATENESS_S)
            print(f"{name:26s} cpu {row['cpu_share'] * 100:6.2f} %   overshoot us {overshoots}", flush=True)
    hvd.shutdown()
    write_results("waiting", rows, {}, args.csv)


if __name__ == "__main__":
    main()
