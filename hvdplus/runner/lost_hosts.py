"""Noticing, in mpirun's own messages, that a job lost a host.

Open MPI 5's prterun, when the daemon of another host dies (the host or its container
gone), prints that it "has lost communication with a remote daemon" and ends the job,
yet may exit with status 0. A job that lost a host has not succeeded: hvdplusrun copies
mpirun's standard error through `start_watching_relay` and reports such a job as failed.
"""

import os
import threading
from typing import BinaryIO

__all__ = ["OPEN_MPI_LOST_HOST", "start_watching_relay"]

# Open MPI 4 (ORTE) and 5 (PRTE) word it alike after their own name.
OPEN_MPI_LOST_HOST = b"has lost communication with a remote daemon"
_READ_BYTES = 65536


def start_watching_relay(source: BinaryIO, target: BinaryIO, marker: bytes) -> threading.Thread:
    """Copy `source` to `target` until it ends, in a thread whose `seen` event is set once
    `marker` has gone by and whose `at_end` event is set when `source` has ended. `source`
    is read to its end whatever happens to `target` (a full pipe would stop mpirun)."""
    seen, at_end = threading.Event(), threading.Event()

    def relay() -> None:
        fd = source.fileno()
        tail = b""  # the end of the last chunk, for a marker split between two reads
        target_open = True
        try:
            while True:
                data = os.read(fd, _READ_BYTES)
                if not data:
                    break
                if marker in tail + data:
                    seen.set()
                tail = (tail + data)[-len(marker):]
                if target_open:
                    try:
                        target.write(data)
                        target.flush()
                    except Exception:  # noqa: BLE001 - never stop draining (see above)
                        target_open = False
        finally:
            at_end.set()

    thread = threading.Thread(target=relay, name="hvdplusrun-stderr", daemon=True)
    thread.seen, thread.at_end = seen, at_end
    thread.start()
    return thread
