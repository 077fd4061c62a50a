"""How long a 2-rank job takes to start and end, by each way of starting one.

    python benchmarks/startup.py [--repeats 5]

A driver outside the job (it is no MPI process itself) times, in turns, jobs that only call
`hvd.init()` and return: `hvdplusrun -np 2 python -c ...` as a subprocess, `hvdplus.run(fn, np=2)`
in this process, `RayExecutor(2)`'s `start()` and `run(fn)` on a local Ray started once before
(`ray.init(num_cpus=2)`, not timed), and, as the floor under all, `mpirun -np 2 python -c "from
mpi4py import MPI"`. Then `hvdplus.run` with a 200 MB argument (a numpy array, which the job's
channel serves to rank 0, which broadcasts it), with a 200 MB result from each rank as well,
and, as the peer, the same array saved to a file whose path is the argument (what a user had to
do while arguments were limited; one machine only). Last, what the job channel's sealing costs:
200 MB from one thread to another over a loopback connection, through the secure channel (each
frame sealed with ChaCha20-Poly1305 and checked) and as plain bytes on the same kind of
connection. Each figure is the median wall time from the
call to its return, interpreter start-up of the ranks included.

Writes benchmarks/results/startup_np2.csv (see harness.write_table).
"""

import argparse
import os
import subprocess
import sys
import socket
import tempfile
import threading
import time

import mpi4py
import numpy as np

mpi4py.rc.initialize = False  # this driver only starts jobs; MPI runs in them

import ray  # noqa: E402
import hvdplus  # noqa: E402 (after MPI's initialization is turned off)
from hvdplus.ray import RayExecutor  # noqa: E402
from harness import REPOSITORY, median_rows, write_driver_table  # noqa: E402
from hvdplus.runner.launch import find_mpi  # noqa: E402
from hvdplus.common.keyed_handshake import HandshakeRoles, receive_exactly  # noqa: E402
from hvdplus.common.secure_channel import accept_session, handshake_deadline, open_session  # noqa: E402

INIT_AND_RETURN = "import hvdplus; hvdplus.init(); hvdplus.shutdown()"
LARGE_BYTES = 200_000_000


def init_and_return():
    import hvdplus as hvd
    hvd.init()
    return hvd.rank()


def size_of(data):
    import hvdplus as hvd
    hvd.init()
    return data.nbytes


def echo(data):
    import hvdplus as hvd
    hvd.init()
    return data


def size_of_saved(path):
    import numpy as np

    import hvdplus as hvd
    hvd.init()
    return np.load(path).nbytes


def save_and_run(data, path):
    np.save(path, data)
    try:
        hvdplus.run(size_of_saved, args=(path,), np=2)
    finally:
        os.remove(path)


def ray_executor_start_and_run():
    executor = RayExecutor(2)
    executor.start()
    try:
        executor.run(init_and_return)
    finally:
        executor.shutdown()


_BENCH_ROLES = HandshakeRoles(server=b"benchmark server", client=b"benchmark client")


def over_loopback(data, sealed: bool) -> None:
    """`data` from a thread to this one over a fresh loopback connection, sealed or plain."""
    key = os.urandom(32)
    listener = socket.create_server(("127.0.0.1", 0))
    received = []

    def receive():
        connection, _ = listener.accept()
        with connection:
            if sealed:
                session = accept_session(connection, key, _BENCH_ROLES, "benchmark", handshake_deadline(30))
                connection.settimeout(None)
                received.append(len(session.receive(limit=len(data))))
            else:
                received.append(len(receive_exactly(connection, len(data))))

    receiver = threading.Thread(target=receive)
    receiver.start()
    with listener, socket.create_connection(listener.getsockname()) as connection:
        if sealed:
            session = open_session(connection, key, _BENCH_ROLES, "benchmark", handshake_deadline(30))
            connection.settimeout(None)
            session.send(memoryview(data))
        else:
            connection.sendall(memoryview(data))
        receiver.join()
    assert received == [len(data)]


def timed(start) -> float:
    began = time.perf_counter()
    start()
    return time.perf_counter() - began


def run_quietly(command):
    subprocess.run(command, cwd=REPOSITORY, check=True, capture_output=True, timeout=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/startup_np2.csv")
    args = parser.parse_args()
    mpirun, dialect = find_mpi()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    data = np.random.default_rng(0).integers(0, 256, LARGE_BYTES, dtype=np.uint8)
    saved = os.path.join(tempfile.gettempdir(), f"hvdplus-startup-{os.getpid()}.npy")
    ways = {
        "hvdplusrun": lambda: run_quietly([sys.executable, "-m", "hvdplus.runner", "-np", "2", sys.executable,
                                           "-c", INIT_AND_RETURN]),
        "hvdplus.run": lambda: hvdplus.run(init_and_return, np=2),
        "RayExecutor.start + run": ray_executor_start_and_run,
        "mpirun and mpi4py alone": lambda: run_quietly(
            [mpirun, *(dialect.run_as_root() if os.geteuid() == 0 else []), "-np", "2", sys.executable, "-c",
             "from mpi4py import MPI"]),
        "hvdplus.run: a 200 MB argument": lambda: hvdplus.run(size_of, args=(data,), np=2),
        "hvdplus.run: a 200 MB argument and 200 MB results": lambda: hvdplus.run(echo, args=(data,), np=2),
        "hvdplus.run: 200 MB saved to a file, its path the argument": lambda: save_and_run(data, saved),
        "200 MB over loopback, secure channel": lambda: over_loopback(data, sealed=True),
        "200 MB over loopback, plain bytes": lambda: over_loopback(data, sealed=False),
    }
    seconds = {way: [] for way in ways}
    for _ in range(args.repeats):
        for way, start in ways.items():
            seconds[way].append(timed(start))
    ray.shutdown()
    write_driver_table("startup", median_rows(seconds), args.csv, "python benchmarks/startup.py")


if __name__ == "__main__":
    main()
