"""Messages from the ranks of an elastic job to `hvdplusrun`, as lines of their output.

mpirun already carries every rank's standard error to the launcher, from any host, so a
rank tells the launcher something (which ranks died, that the job must restart) by writing
one line there: `MARKER`, then a JSON object, then a newline, in one write. The launcher
reads mpirun's output through a `MessageFilter`, which takes these lines out of it and
passes everything else on. No folder has to be shared: rank 0 may run on any host.

The marker opens with the ASCII record separator, which program output hardly ever
contains; a line that holds the marker but no valid message is passed on as it is.
"""

import json
import os
import re
import sys
from typing import Callable, Dict, List

__all__ = ["MARKER", "encode", "send", "MessageFilter"]

MARKER = b"\x1ehvdplus-launcher "
# What may come before a message on its line: nothing, or the rank tag that mpirun (Open MPI's
# `--output tag`, "[1,0]<stderr>: ") or hvdplusrun's own tagging of MPICH's pieces ("[0] ") adds.
_TAG_ONLY = re.compile(rb"(?:\[\d+(?:,\d+)?\](?:<\w+>:)? ?)?")
# What a read may cut such a tag down to, at the end of the output: held back until the next
# read shows whether a message follows.
_TAG_BEGINNING = re.compile(rb"\[(?:\d+(?:,(?:\d+)?)?(?:\](?:<(?:\w+(?:>(?::)?)?)?)?)?)?")
# A line that holds the marker is held back until it ends; past this length it is passed on.
_LONGEST_LINE = 1 << 16


def encode(message: Dict) -> bytes:
    return MARKER + json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(message: Dict) -> None:
    """Write `message` for the launcher to this process's standard error, in one write (so
    that it reaches mpirun whole, not interleaved with other output)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), encode(message))


class MessageFilter:
    """Takes the messages out of a stream of output, passing the rest on unchanged.

    Args:
        deliver: called with each message (a dict), in order.
    """

    def __init__(self, deliver: Callable[[Dict], None]):
        self._deliver = deliver
        self._held = b""  # from the start of a line that holds a marker's first byte

    def feed(self, data: bytes) -> bytes:
        """The output among `data` (and what was held back before it) to pass on now."""
        data = self._held + data
        self._held = b""
        out: List[bytes] = []
        start = 0
        while True:
            at = data.find(MARKER[:1], start)
            if at < 0:
                newline = data.rfind(b"\n", start)
                line_start = newline + 1 if newline >= 0 else start
                if _TAG_BEGINNING.fullmatch(data, line_start) or _TAG_ONLY.fullmatch(data, line_start):
                    out.append(data[start:line_start])
                    self._held = data[line_start:]
                else:
                    out.append(data[start:])
                break
            newline = data.rfind(b"\n", start, at)
            line_start = newline + 1 if newline >= 0 else start
            line_end = data.find(b"\n", at)
            if line_end < 0:
                if len(data) - line_start > _LONGEST_LINE or not MARKER.startswith(data[at:at + len(MARKER)]):
                    # Not a message, or not one that is ever coming whole: pass it on.
                    out.append(data[start:at + 1])
                    start = at + 1
                    continue
                out.append(data[start:line_start])
                self._held = data[line_start:]
                break
            message = self._message(data[at:line_end])
            if message is None:
                out.append(data[start:at + 1])
                start = at + 1
                continue
            prefix = data[line_start:at]
            out.append(data[start:line_start])
            if not _TAG_ONLY.fullmatch(prefix):
                out.append(prefix)  # a line the rank had not finished: it goes on after the message
            self._deliver(message)
            start = line_end + 1
        return b"".join(out)

    def close(self) -> bytes:
        """The output held back when the stream ends."""
        held, self._held = self._held, b""
        return held

    @staticmethod
    def _message(text: bytes):
        if not text.startswith(MARKER):
            return None
        try:
            message = json.loads(text[len(MARKER):])
        except ValueError:
            return None
        return message if isinstance(message, dict) else None
