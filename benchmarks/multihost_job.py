"""The MPI job of benchmarks/multihost.py, run in the containers it starts: measures the
cost model's constants (benchmarks/cost_model.py) on the links as they are, then the time of
each all-reduce at each size, hvd.allreduce through the engine included. Rank 0 prints one
line, "RESULT <json>".

Ranks not taking part in a measurement wait with a sleeping poll rather than in an MPI
call: the containers share the machine's cores, and a rank spinning in MPI would take a
core from the ranks being measured.
"""

import argparse
import functools
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvdplus as hvd
from hvdplus.common.reduce_ops import ReduceOp
from hvdplus.core import runtime
from harness import library_versions

WORLD = MPI.COMM_WORLD
ENGINE = "hvd.allreduce"
AUTOTUNED = "hvd.allreduce, autotuned"
MAX_TUNING_STEPS = 2000


def quiet_barrier():
    request = WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def ping_pong(peer_a, peer_b, nbytes, repeats):
    """Median seconds of peer_a sending `nbytes` to peer_b and getting 1 byte back."""
    rank = WORLD.Get_rank()
    samples = []
    message, reply = np.ones(max(nbytes, 1), np.uint8), np.zeros(1, np.uint8)
    for _ in range(repeats + 1):
        quiet_barrier()
        if rank == peer_a:
            start = time.perf_counter()
            WORLD.Send(message[:nbytes], dest=peer_b)
            WORLD.Recv(reply, source=peer_b)
            samples.append(time.perf_counter() - start)
        elif rank == peer_b:
            WORLD.Recv(message[:nbytes], source=peer_a)
            WORLD.Send(reply, dest=peer_a)
    return WORLD.bcast(statistics.median(samples[1:]) if rank == peer_a else None, root=peer_a)


def link_constants(peer_a, peer_b, big_bytes):
    """(alpha, beta) of the link between two ranks: latency from 1-byte ping-pongs, seconds
    per byte beyond it from a `big_bytes` message one way."""
    small = ping_pong(peer_a, peer_b, 1, 50) / 2
    return small, (ping_pong(peer_a, peer_b, big_bytes, 5) - 2 * small) / big_bytes


def reduce_seconds_per_byte():
    """numpy's elementwise float32 sum, on one rank while the others sleep."""
    seconds = 0.0
    if WORLD.Get_rank() == 0:
        a, b = np.ones(16 << 20, np.float32), np.ones(16 << 20, np.float32)  # past the caches
        samples = []
        for _ in range(7):
            start = time.perf_counter()
            np.add(a, b, out=a)
            samples.append(time.perf_counter() - start)
        seconds = statistics.median(samples) / a.nbytes
    quiet_barrier()
    return WORLD.bcast(seconds)


def timed(step):
    """Seconds of one `step()`, from a barrier to the slowest rank's end."""
    quiet_barrier()
    start = time.perf_counter()
    step()
    return WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)


def through_engine(data, out):
    hvd.allreduce_async(data, name="multihost", op=hvd.Sum, output=out).wait()


def tune(mib):
    """All-reduce `mib` MiB through the engine until its autotuner has chosen; the choice."""
    data = np.ones(int(mib * 2**20) // 4, np.float32)
    out = np.empty_like(data)
    engine = runtime.current().engine
    if not engine.settings.autotune:
        raise SystemExit("--autotune needs HOROVOD_AUTOTUNE=1 in the job's environment")
    for steps in range(1, MAX_TUNING_STEPS + 1):
        through_engine(data, out)
        chosen = WORLD.bcast(engine.tuned_setting() if WORLD.Get_rank() == 0 else None)
        if chosen is not None:
            return {"tuned": str(chosen), "tuning_steps": steps}
    raise SystemExit(f"the autotuner had not chosen after {MAX_TUNING_STEPS} all-reduces")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, nargs="+", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--autotune", action="store_true",
                        help="the job runs with HOROVOD_AUTOTUNE=1: all-reduce the first size through the engine "
                             "until the tuner has chosen, then measure it beside MPI, ring and hierarchical")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    layer = runtime.current().algorithms
    per_host = hvd.local_size()
    hosts = size // per_host
    # The first rank of the second host, and rank 0's neighbour on its own host.
    alpha_cross, beta_cross = link_constants(0, per_host, 16 << 20)
    alpha_local, beta_local = link_constants(0, 1, 64 << 20) if per_host > 1 else (0.0, 0.0)
    constants = {"alpha_cross": alpha_cross, "beta_cross": beta_cross, "alpha_local": alpha_local,
                 "beta_local": beta_local, "gamma": reduce_seconds_per_byte()}
    methods = {
        "MPI Allreduce": lambda data, out: WORLD.Allreduce(data, out, op=MPI.SUM),
        "ring": lambda data, out: layer.reduce(data, ReduceOp.SUM, out, algorithm="ring"),
        "hierarchical": lambda data, out: layer.reduce(data, ReduceOp.SUM, out, algorithm="hierarchical"),
        "auto": lambda data, out: layer.reduce(data, ReduceOp.SUM, out),
        # The whole path a training script takes: negotiation, the engine thread, auto.
        ENGINE: through_engine,
    }
    tuning = {}
    if args.autotune:
        del methods["auto"], methods[ENGINE]
        methods[AUTOTUNED] = through_engine
        tuning = tune(args.mib[0])
    rows = []
    for mib in args.mib:
        data = np.random.default_rng(rank).random(int(mib * 2**20) // 4, dtype=np.float32)
        out = np.empty_like(data)
        expected = WORLD.allreduce(float(data.astype(np.float64).sum()))
        samples = {name: [] for name in methods}
        for _ in range(args.rounds):  # in turns, so that every method sees the same drift
            for name, method in methods.items():
                samples[name].append(timed(functools.partial(method, data, out)))
                if abs(float(out.astype(np.float64).sum()) - expected) > 1e-3 * abs(expected):
                    raise AssertionError(f"{name} all-reduced {mib} MiB wrongly")
        rows += [{"bytes": data.nbytes, "method": name, "seconds": statistics.median(values),
                  "auto_chose": layer.choose(data.nbytes)} for name, values in samples.items()]
        del data, out
    if rank == 0:
        print("RESULT " + json.dumps({"hosts": hosts, "per_host": per_host, "constants": constants, "rows": rows,
                                     **tuning, **library_versions()}),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
