"""Noticing, in mpirun's own messages, that a job lost a host.

Open MPI 5's prterun, when the daemon of another host dies (the host or its container
gone), prints that it "has lost communication with a remote daemon" and ends the job,
yet may exit with status 0. A job that lost a host has not succeeded: hvdplusrun copies
mpirun's standard output and error through `start_watching_relay` (prterun writes one of
these messages to each) and reports such a job as failed.
"""

import os
import re
import threading
from typing import BinaryIO, Callable, List, Optional, Sequence

from ..common.launcher_messages import MessageFilter
from .rank_output import write_output

__all__ = ["OPEN_MPI_LOST_HOST", "OPEN_MPI_LOST_HOST_MARKERS", "start_watching_relay", "lost_host_names"]

# What starts each of Open MPI's messages about a host gone, and where that message names it.
# Open MPI 4 (ORTE) and 5 (PRTE) say after their own name that they lost a remote daemon:
# "Remote daemon: [prterun-...@0,2] on node node3". When the host's ssh session ends first
# (its container killed), prterun says instead, on its standard output, that the daemon
# failed to report back, naming "Remote host:   node3" after "Local host:".
OPEN_MPI_LOST_HOST = b"has lost communication with a remote daemon"
_OPEN_MPI_MESSAGES = (
    (OPEN_MPI_LOST_HOST, re.compile(rb"Remote daemon:[^\n]*? on node (\S+)")),
    (b"A daemon failed to report back", re.compile(rb"Remote host:[ \t]*(\S+)")),
)
OPEN_MPI_LOST_HOST_MARKERS = tuple(marker for marker, _ in _OPEN_MPI_MESSAGES)
_MESSAGE_BYTES = 2048  # a message names its host within this many bytes of its start
_READ_BYTES = 65536
_KEPT_BYTES = 1 << 18  # of the text after the first marker, enough for the messages and hosts


def lost_host_names(text: bytes) -> List[str]:
    """The hosts Open MPI's messages about lost daemons in `text` name, in order, once each."""
    found = []  # (where the name is, name)
    for marker, names_host in _OPEN_MPI_MESSAGES:
        start = text.find(marker)
        while start >= 0:
            match = names_host.search(text, start, start + _MESSAGE_BYTES)
            if match:
                found.append((match.start(1), match.group(1).decode(errors="replace")))
            start = text.find(marker, start + len(marker))
    return list(dict.fromkeys(name for _, name in sorted(found)))


def start_watching_relay(source: BinaryIO, target: BinaryIO, markers: Sequence[bytes],
                         on_message: Optional[Callable[[dict], None]] = None) -> threading.Thread:
    """Copy `source` to `target` until it ends, in a thread whose `seen` event is set once
    one of `markers` has gone by and whose `at_end` event is set when `source` has ended; its
    `after_marker` holds the text from that marker on (the start of it), where Open MPI names
    the host. With `on_message`, the ranks' messages to the launcher (launcher_messages) are
    handed to it instead of copied. `source` is read to its end whatever happens to `target`
    (a full pipe would stop mpirun)."""
    seen, at_end = threading.Event(), threading.Event()
    after_marker = bytearray()
    longest = max((len(marker) for marker in markers), default=0)
    messages = MessageFilter(on_message) if on_message is not None else None

    def relay() -> None:
        fd = source.fileno()
        tail = b""  # the end of the last chunk, for a marker split between two reads
        target_open = True
        try:
            while True:
                data = os.read(fd, _READ_BYTES)
                if not data:
                    break
                if markers and not seen.is_set():
                    joined = tail + data
                    starts = [joined.find(marker) for marker in markers]
                    starts = [start for start in starts if start >= 0]
                    if starts:
                        seen.set()
                        after_marker.extend(joined[min(starts):])
                elif seen.is_set() and len(after_marker) < _KEPT_BYTES:
                    after_marker.extend(data)
                tail = (tail + data)[-longest:] if longest else b""
                if messages is not None:
                    data = messages.feed(data)
                target_open = target_open and write_output(target, data)
            if messages is not None:
                target_open = target_open and write_output(target, messages.close())
        finally:
            at_end.set()

    thread = threading.Thread(target=relay, name="hvdplusrun-watch", daemon=True)
    thread.seen, thread.at_end, thread.after_marker = seen, at_end, after_marker
    thread.start()
    return thread
