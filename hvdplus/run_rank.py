"""What each rank of a job that `hvdplus.run` started runs: `python -m hvdplus.run_rank`.

Each rank finds the function and its arguments (cloudpickled by the caller) in its environment
(hvdplus.common.function_payload), which mpirun passes to every host; when they are too large
for it, rank 0 fetches them from the job's channel (payload_channel) and broadcasts them to
the others over MPI. No file has to reach other hosts. Each rank calls the function and tells
the caller, in lines of its standard error (hvdplus.common.launcher_messages), what it
returned (a large result through the job's channel) or what it raised. A rank that raises
ends the whole job at once (MPI_Abort), so that the caller hears of it within seconds, however
long the other ranks would still compute.
"""

import base64
import os
import time

import cloudpickle
import numpy as np
from mpi4py import MPI

from .common import function_payload, launcher_messages, payload_channel, rank_errors

# Results travel in pieces of this many base64 characters, each within one message line; a
# larger one goes through the job's channel: Open MPI may drop the end of a remote rank's output
# when that output is large and the job ends.
CHUNK_CHARS = 32 * 1024
LINES_BYTES = 1 << 20
# A served payload is broadcast in pieces of this many bytes (an MPI count is a C int).
BROADCAST_BYTES = 1 << 28


def send_result(value) -> None:
    pickled = cloudpickle.dumps(value)
    rank = rank_errors.rank_in_job()
    if len(pickled) > LINES_BYTES and payload_channel.has_channel(os.environ):
        # The message that names it follows the launch's other messages, in order.
        launcher_messages.send({"result": rank, "posted": payload_channel.post(os.environ, pickled)})
        return
    encoded = base64.b64encode(pickled).decode()
    pieces = [encoded[at:at + CHUNK_CHARS] for at in range(0, len(encoded), CHUNK_CHARS)] or [""]
    for index, piece in enumerate(pieces):
        launcher_messages.send({"result": rank, "piece": index, "pieces": len(pieces), "data": piece})


def send_error(error: BaseException) -> None:
    """Tell the caller what this rank raised: its host, the user's line, the traceback from the
    user's function on (rank_errors), and the status the rank exits with (_fail's)."""
    report = rank_errors.raised_report(error, rank_errors.rank_in_job(), exit_code=1)
    launcher_messages.send(report.to_message())


def receive_payload(comm) -> memoryview:
    """The function and its arguments, pickled: from the environment, or fetched by rank 0 from
    the job's channel and broadcast to every rank of `comm`."""
    if function_payload.in_environment(os.environ):
        return memoryview(function_payload.from_environment(os.environ))
    fetched, failure = None, None
    if comm.Get_rank() == 0:
        try:
            fetched = np.frombuffer(payload_channel.fetch(os.environ), np.uint8)
        except ConnectionError as error:
            failure = str(error)
    # Every rank hears whether rank 0 has it, so that none waits for a broadcast that never comes.
    size = comm.bcast(failure if fetched is None else fetched.size, root=0)
    if isinstance(size, str):
        raise ConnectionError(size)
    data = fetched if fetched is not None else np.empty(size, np.uint8)
    for start in range(0, size, BROADCAST_BYTES):
        comm.Bcast(data[start:start + BROADCAST_BYTES], root=0)
    return memoryview(data)


def _fail(comm, error: BaseException) -> None:
    send_error(error)
    # The message must leave before MPI ends the job's processes.
    time.sleep(rank_errors.DELIVERY_SECONDS)
    comm.Abort(1)
    os._exit(1)


def main() -> None:
    comm = MPI.COMM_WORLD
    try:
        function, args, kwargs = cloudpickle.loads(receive_payload(comm))
    except ConnectionError as error:
        if comm.Get_rank() == 0:  # every rank has the same error: the caller hears it once
            _fail(comm, error)
        time.sleep(5)  # rank 0 ends the job
        os._exit(1)
    if comm.Get_rank() == 0:
        launcher_messages.send({"run_started": comm.Get_size()})
    try:
        value = function(*args, **kwargs)
    except SystemExit:
        raise  # an elastic job ending for a restart, or the function's own exit
    except BaseException as error:  # noqa: BLE001 - every error goes back to the caller
        _fail(comm, error)
    send_result(value)


if __name__ == "__main__":
    main()
