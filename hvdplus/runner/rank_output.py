"""Whole lines tagged with their rank, out of MPICH's hydra, which tags pieces instead.

Hydra's `-prepend-rank` writes the tag before every piece it reads from a rank, not before
every line: a line a rank writes in two pieces (unbuffered Python writes print's text and
its newline separately, and a traceback's caret line a character at a time) comes out
as `[0] text[0] ` plus a line holding only a tag, and another rank's piece can land in the
middle of it. So hvdplusrun has hydra mark every piece with `MARKER_PATTERN` instead, reads
mpiexec's stdout and stderr, collects each rank's pieces until its line ends, and writes
whole lines tagged `[rank] `.

Hydra ends a piece at a newline or where its read from the rank ended; text between pieces
without a marker is hydra's own (its abort banner), passed on as it is. A line also ends at
a carriage return, so that progress bars redraw as they go. The marker is wrapped in the
ASCII unit separator, which program output hardly ever contains, terminals do not show (run
by hand, the marked command still prints readable `[0] ` tags), and `str.splitlines` does
not split at; one in a rank's output that does not open a whole marker is kept as data.
"""

import codecs
import os
import re
import threading
from typing import BinaryIO, Callable, Dict, List, Optional, TextIO

from ..common.launcher_messages import MessageFilter

__all__ = ["MARKER_PATTERN", "RankLineTagger", "binary_target", "start_relay", "write_output"]

# Hydra replaces %r with the rank.
MARKER_PATTERN = "\x1f[%r] \x1f"
_SEPARATOR = b"\x1f"
_MARKER = re.compile(rb"\x1f\[(\d{1,9})\] \x1f")
# What the end of a read may cut a marker down to.
_MARKER_BEGINNING = re.compile(rb"\x1f(?:\[(?:\d{1,9}(?:\](?: )?)?)?)?")
_LINE_ENDS = re.compile(rb"\r\n|\n|\r")
# Each piece parsed copies what is left of the read, so reads stay small.
_READ_BYTES = 16 * 1024
_MORE_INPUT = object()


def _marker_at(data: bytes, at: int):
    """The rank of the whole marker at `at` and where it ends; _MORE_INPUT where `data` ends
    inside what may still become one; None where no marker starts there."""
    match = _MARKER.match(data, at)
    if match:
        return int(match.group(1)), match.end()
    if _MARKER_BEGINNING.fullmatch(data, at):
        return _MORE_INPUT
    return None


def _next_marker(data: bytes):
    """(where the first marker in `data` begins, what _marker_at says of it), or
    (len(data), None) when there is none."""
    at = data.find(_SEPARATOR)
    while at >= 0:
        found = _marker_at(data, at)
        if found is not None:
            return at, found
        at = data.find(_SEPARATOR, at + 1)
    return len(data), None


class RankLineTagger:
    """Turns one of hydra's marked streams into whole lines, each tagged `[rank] `.

    Args:
        write: called with each run of finished output (bytes).
    """

    def __init__(self, write: Callable[[bytes], None]):
        self._write = write
        self._pending = b""  # read but not yet parsed
        self._rank: Optional[int] = None  # whose piece is being read; None between pieces
        self._partial: Dict[int, bytes] = {}  # each rank's line so far, still without its end

    def feed(self, data: bytes) -> None:
        """Parse the next bytes of the stream; write every line they finish."""
        self._pending += data
        while self._pending and self._step():
            pass

    def close(self) -> None:
        """The stream ended: write what is left, ending each rank's unfinished line."""
        if self._rank is not None:
            self._partial[self._rank] = self._partial.get(self._rank, b"") + self._pending
        elif self._pending:
            self._write(self._pending)
        self._pending, self._rank = b"", None
        for rank in sorted(self._partial):
            self._write(b"[%d] %s\n" % (rank, self._partial[rank]))
        self._partial.clear()

    def _step(self) -> bool:
        """Consume one line, piece, marker or run of hydra's text; False when more input is needed."""
        if self._rank is None:
            return self._between_pieces()
        rank = self._rank
        marker, found = _next_marker(self._pending)
        line_end = _LINE_ENDS.search(self._pending, 0, marker)
        # A carriage return last in the read may still be followed by its newline.
        if line_end and line_end.group() == b"\r" and line_end.end() == len(self._pending):
            kept = line_end.start()
            line_end = None
        else:
            kept = marker
        if line_end:
            line = self._partial.pop(rank, b"") + self._pending[:line_end.end()]
            self._write(b"[%d] %s" % (rank, line))
            self._pending = self._pending[line_end.end():]
            if line_end.group().endswith(b"\n"):
                self._rank = None  # hydra ends its pieces at newlines, not at carriage returns
            return True
        # The piece goes on to `marker`: a new piece, or the end of what was read.
        self._partial[rank] = self._partial.get(rank, b"") + self._pending[:kept]
        self._pending = self._pending[kept:]
        if kept == marker and isinstance(found, tuple):
            self._rank = None  # the piece ended with hydra's read, mid-line
            return True
        return False

    def _between_pieces(self) -> bool:
        start, found = _next_marker(self._pending)
        if found is None or found is _MORE_INPUT:
            # Hydra's own lines: pass on whole ones, keep a line it has not finished.
            finished = self._pending.rfind(b"\n", 0, start) + 1
            if finished:
                self._write(self._pending[:finished])
            self._pending = self._pending[finished:]
            return False
        if start:
            self._write(self._pending[:start])
        self._rank, end = found
        self._pending = self._pending[end:]
        return True


class _TextTarget:
    """Takes bytes for a text stream that has no binary buffer under it: a Jupyter kernel's
    `sys.stdout`, or one that `contextlib.redirect_stdout` put in place. A character that
    one read cut in two is decoded whole, with the next read."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def binary_target(stream: TextIO) -> BinaryIO:
    """Where the relays write what is meant for `stream` (sys.stdout, sys.stderr): its binary
    buffer, or, for a stream without one, the stream itself through a decoder."""
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else _TextTarget(stream)


def write_output(target: BinaryIO, data: bytes) -> bool:
    """Write `data` to `target`; whether `target` still takes output. A reader that is gone
    (`hvdplusrun ... | head`) must not stop the relays, which drain mpirun's pipes to their end."""
    try:
        if data:
            target.write(data)
            target.flush()
        return True
    except Exception:  # noqa: BLE001 - never stop draining
        return False


def start_relay(source: BinaryIO, target: BinaryIO,
                on_message: Optional[Callable[[dict], None]] = None) -> threading.Thread:
    """Copy the marked stream `source` to `target` as tagged lines until it ends, in a thread;
    with `on_message`, the ranks' messages to the launcher (launcher_messages) are handed to
    it instead.

    Whatever goes wrong on the way out (the reader of `target` gone, as in `hvdplusrun ... |
    head`), `source` is read to its end all the same: a full pipe would stop mpiexec, and with
    it the job. The thread's `at_end` event is set once `source` has ended."""
    at_end = threading.Event()
    messages = MessageFilter(on_message) if on_message is not None else None

    def relay() -> None:
        finished: List[bytes] = []
        tagger = RankLineTagger(
            finished.append if messages is None else lambda lines: finished.append(messages.feed(lines)))
        fd = source.fileno()
        target_open = True
        try:
            while True:
                data = os.read(fd, _READ_BYTES)
                # Parsed even once `target` is gone: the ranks' messages must still arrive.
                if data:
                    tagger.feed(data)
                else:
                    tagger.close()
                    if messages is not None:
                        finished.append(messages.close())
                target_open = target_open and write_output(target, b"".join(finished))
                finished.clear()
                if not data:
                    break
        finally:
            at_end.set()
            source.close()

    thread = threading.Thread(target=relay, name="hvdplusrun-output", daemon=True)
    thread.at_end = at_end
    thread.start()
    return thread
