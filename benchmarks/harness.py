"""What the benchmarks share: timing training loops across ranks, and starting the peers
hvdplus is measured against inside the same MPI job."""

import socket
import statistics
import time

from mpi4py import MPI

__all__ = ["throughput", "init_gloo"]


def throughput(run, batch, steps, participants, comm=MPI.COMM_WORLD):
    """Samples/s of all `participants` ranks together: `run(n)` trains n steps of `batch`
    samples; after 3 warm-up steps, the median of 3 rounds of `steps`, each timed from a
    barrier to the slowest rank's end."""
    run(3)
    rounds = []
    for _ in range(3):
        comm.Barrier()
        start = time.perf_counter()
        run(steps)
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        rounds.append(participants * batch * steps / elapsed)
    return statistics.median(rounds)


def init_gloo(comm):
    """torch.distributed over gloo on loopback, one process per rank of `comm`.

    Returns the `torch.distributed` module, or None when torch is not installed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist
