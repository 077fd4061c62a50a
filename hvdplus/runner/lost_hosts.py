"""Noticing, in mpirun's own messages, that a job lost a host.

Open MPI 5's prterun, when the daemon of another host dies (the host or its container
gone), prints that it "has lost communication with a remote daemon" and ends the job,
yet may exit with status 0. A job that lost a host has not succeeded: hvdplusrun copies
mpirun's standard error through `start_watching_relay` and reports such a job as failed.
"""

import os
import re
import threading
from typing import BinaryIO, List

__all__ = ["OPEN_MPI_LOST_HOST", "start_watching_relay", "lost_host_names"]

# Open MPI 4 (ORTE) and 5 (PRTE) word it alike after their own name, and then name the host:
# "Remote daemon: [prterun-...@0,2] on node node3".
OPEN_MPI_LOST_HOST = b"has lost communication with a remote daemon"
_LOST_NODE = re.compile(rb"Remote daemon:[^\n]*? on node (\S+)")
_READ_BYTES = 65536
_KEPT_BYTES = 1 << 18  # of the text after the marker, enough for the message and its host


def lost_host_names(text: bytes) -> List[str]:
    """The hosts an Open MPI message about lost daemons names, in order, once each."""
    return list(dict.fromkeys(name.decode(errors="replace") for name in _LOST_NODE.findall(text)))


def start_watching_relay(source: BinaryIO, target: BinaryIO, marker: bytes) -> threading.Thread:
    """Copy `source` to `target` until it ends, in a thread whose `seen` event is set once
    `marker` has gone by and whose `at_end` event is set when `source` has ended; its
    `after_marker` holds the text from the marker on (the start of it), where Open MPI names
    the host. `source` is read to its end whatever happens to `target` (a full pipe would
    stop mpirun)."""
    seen, at_end = threading.Event(), threading.Event()
    after_marker = bytearray()

    def relay() -> None:
        fd = source.fileno()
        tail = b""  # the end of the last chunk, for a marker split between two reads
        target_open = True
        try:
            while True:
                data = os.read(fd, _READ_BYTES)
                if not data:
                    break
                if not seen.is_set() and marker in tail + data:
                    seen.set()
                    data_from = (tail + data)
                    after_marker.extend(data_from[data_from.index(marker):])
                elif seen.is_set() and len(after_marker) < _KEPT_BYTES:
                    after_marker.extend(data)
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
    thread.seen, thread.at_end, thread.after_marker = seen, at_end, after_marker
    thread.start()
    return thread
