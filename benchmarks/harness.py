"""What the benchmarks share: timing training loops across ranks, and starting the peers
hvdplus is measured against inside the same MPI job."""

import socket
import statistics
import time

from mpi4py import MPI

__all__ = ["throughput", "interleaved_throughputs", "array_batches", "fit_runner", "init_gloo"]


def throughput(run, batch, steps, participants, comm=MPI.COMM_WORLD):
    """Samples/s of all `participants` ranks together: `run(n)` trains n steps of `batch`
    samples; after 3 warm-up steps, the median of 3 rounds of `steps`, each timed from a
    barrier to the slowest rank's end. A `run` that returns (seconds, steps) timed itself
    in steady state (see fit_seconds), and that counts instead."""
    run(3)
    return statistics.median([_timed_round(run, batch, steps, participants, comm) for _ in range(3)])


def _timed_round(run, batch, steps, participants, comm):
    """Samples/s of one `run(steps)`, from a barrier to the slowest rank's end (or as `run`
    timed itself)."""
    comm.Barrier()
    start = time.perf_counter()
    measured = run(steps)
    elapsed, counted = measured if measured is not None else (time.perf_counter() - start, steps)
    elapsed = comm.allreduce(elapsed, op=MPI.MAX)
    return participants * batch * counted / elapsed


def interleaved_throughputs(runs, batch, steps, rounds=9, comm=MPI.COMM_WORLD):
    """{label: samples/s} for `runs` ({label: (run, participants)}, as in throughput()),
    measured in turns: every round times `steps` steps of each run, one after the other,
    and each result is the median over the rounds. On a shared 2-core VM whose speed drifts
    by up to 2x within a minute, measuring one run after the other biased whole ratios
    (the same MLP measured 0.56 and 0.73 efficiency in back-to-back jobs); in turns, every
    run sees the same drift."""
    for run, _ in runs.values():
        run(3)
    samples = {label: [] for label in runs}
    for _ in range(rounds):
        for label, (run, participants) in runs.items():
            samples[label].append(_timed_round(run, batch, steps, participants, comm))
    return {label: statistics.median(values) for label, values in samples.items()}


def fit_seconds(model, data, skipped=5):
    """(seconds, steps) of one epoch of `model.fit(**data)`, from the end of batch `skipped`
    to the end of the last: the fit's own start and finish (building the dataset iterator,
    tearing it down: 80-350 ms on a 2-core VM, more than 40 steps) stay out of steady state."""
    import keras

    ends = []

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            ends.append(time.perf_counter())

    model.fit(**data, epochs=1, verbose=0, callbacks=[StepClock()])
    if len(ends) <= skipped:
        raise ValueError(f"fit ran {len(ends)} steps; steady state needs more than {skipped}")
    return ends[-1] - ends[skipped - 1], len(ends) - skipped


def array_batches(x, y, batch):
    """`data_for` for fit_runner: the first n batches of arrays `x` and `y`, in order."""
    return lambda n: {"x": x[:n * batch], "y": y[:n * batch], "batch_size": batch, "shuffle": False}


def fit_runner(model, data_for, skipped=5):
    """`run(n)` for throughput(): n batches of `model.fit(**data_for(n))`, timed in steady
    state when n is more than `skipped` (a plain fit for the harness' warm-up)."""

    def run(n):
        if n <= skipped:
            model.fit(**data_for(n), epochs=1, verbose=0)
            return None
        return fit_seconds(model, data_for(n), skipped)

    return run


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
