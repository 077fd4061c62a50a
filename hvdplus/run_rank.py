"""What each rank of a job that `hvdplus.run` started runs: `python -m hvdplus.run_rank`.

Each rank finds the function and its arguments (cloudpickled by the caller) in its environment
(hvdplus.common.function_payload), which mpirun passes to every host; no file has to reach
other hosts. Each rank calls the function and tells the caller, in
lines of its standard error (hvdplus.common.launcher_messages), what it returned or what it
raised. A rank that raises ends the whole job at once (MPI_Abort), so that the caller hears
of it within seconds, however long the other ranks would still compute.
"""

import base64
import os
import sys
import time
import traceback

import cloudpickle
from mpi4py import MPI

from .common import function_payload, launcher_messages

# Results travel in pieces of this many base64 characters, each within one message line.
CHUNK_CHARS = 32 * 1024
# The longest traceback sent whole; a longer one loses its middle.
TRACEBACK_CHARS = 32 * 1024


def _rank() -> int:
    """This rank's number in the job as it stands: hvdplus's, after an elastic re-form."""
    runtime = sys.modules.get("hvdplus.core.runtime")
    if runtime is not None and runtime.is_initialized():
        return runtime.rank()
    return MPI.COMM_WORLD.Get_rank()


def send_result(value) -> None:
    encoded = base64.b64encode(cloudpickle.dumps(value)).decode()
    pieces = [encoded[at:at + CHUNK_CHARS] for at in range(0, len(encoded), CHUNK_CHARS)] or [""]
    rank = _rank()
    for index, piece in enumerate(pieces):
        launcher_messages.send({"result": rank, "piece": index, "pieces": len(pieces), "data": piece})


def send_error(error: BaseException) -> None:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if len(text) > TRACEBACK_CHARS:
        text = text[:TRACEBACK_CHARS // 2] + "\n...\n" + text[-TRACEBACK_CHARS // 2:]
    launcher_messages.send({"error": _rank(), "type": type(error).__qualname__, "message": str(error),
                            "traceback": text})


def main() -> None:
    comm = MPI.COMM_WORLD
    function, args, kwargs = cloudpickle.loads(function_payload.from_environment(os.environ))
    if comm.Get_rank() == 0:
        launcher_messages.send({"run_started": comm.Get_size()})
    try:
        value = function(*args, **kwargs)
    except SystemExit:
        raise  # an elastic job ending for a restart, or the function's own exit
    except BaseException as error:  # noqa: BLE001 - every error goes back to the caller
        send_error(error)
        # The message must leave before MPI ends the job's processes.
        time.sleep(0.2)
        comm.Abort(1)
        os._exit(1)
    send_result(value)


if __name__ == "__main__":
    main()
