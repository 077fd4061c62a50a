"""Whole lines tagged with their rank, out of MPICH's hydra, which tags pieces instead.

Hydra's `-prepend-rank` writes the tag before every piece it reads from a rank, not before
every line: a line a rank writes in two pieces (unbuffered Python writes print's text and
its newline separately, and a traceback's caret line a character at a time) comes out
as `[0] text[0] ` plus a line holding only a tag, and another rank's piece can land in the
middle of it. So hvdplusrun has hydra mark every piece with `MARKER_PATTERN` instead, reads
mpiexec's stdout and stderr, collects each rank's pieces until its line ends, and writes
whole lines tagged `[rank] `.

Hydra ends a piece at a newline or where its read from the rank ended; text between pieces
without a marker is hydra's own (its abort banner), passed on as it is. The marker is
wrapped in ASCII separator characters that program output hardly ever contains, which
terminals do not show: run by hand, the marked command still prints readable `[0] ` tags.
"""

import os
import re
import threading
from typing import BinaryIO, Callable, Dict, List, Optional

__all__ = ["MARKER_PATTERN", "RankLineTagger", "start_relay"]

# Hydra replaces %r with the rank.
MARKER_PATTERN = "\x1e[%r] \x1f"
_MARKER = re.compile(rb"\x1e\[(\d+)\] \x1f")
_MARKER_START, _MARKER_END = b"\x1e", b"\x1f"
# Each piece parsed copies what is left of the read, so reads stay small.
_READ_BYTES = 16 * 1024


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
        """Consume one piece, marker or run of hydra's text; False when more input is needed."""
        if self._rank is None:
            return self._between_pieces()
        newline = self._pending.find(b"\n")
        marker = self._pending.find(_MARKER_START)
        rank = self._rank
        if newline >= 0 and (marker < 0 or newline < marker):
            line = self._partial.pop(rank, b"") + self._pending[:newline + 1]
            self._write(b"[%d] %s" % (rank, line))
            self._pending, self._rank = self._pending[newline + 1:], None
            return True
        if marker >= 0:
            # The piece ended with hydra's read, mid-line: the line goes on in a later piece.
            self._partial[rank] = self._partial.get(rank, b"") + self._pending[:marker]
            self._pending, self._rank = self._pending[marker:], None
            return True
        self._partial[rank] = self._partial.get(rank, b"") + self._pending
        self._pending = b""
        return False

    def _between_pieces(self) -> bool:
        start = self._pending.find(_MARKER_START)
        if start < 0:
            # Hydra's own lines: pass on whole ones, keep a line it has not finished.
            finished = self._pending.rfind(b"\n") + 1
            if finished:
                self._write(self._pending[:finished])
            self._pending = self._pending[finished:]
            return False
        if start:
            self._write(self._pending[:start])
            self._pending = self._pending[start:]
        end = self._pending.find(_MARKER_END)
        if end < 0:
            return False  # the rest of the marker is still to come
        match = _MARKER.fullmatch(self._pending, 0, end + 1)
        if match is None:
            self._write(self._pending[:end + 1])
        else:
            self._rank = int(match.group(1))
        self._pending = self._pending[end + 1:]
        return True


def start_relay(source: BinaryIO, target: BinaryIO) -> threading.Thread:
    """Copy the marked stream `source` to `target` as tagged lines until it ends, in a thread."""

    def relay() -> None:
        finished: List[bytes] = []
        tagger = RankLineTagger(finished.append)
        fd = source.fileno()
        target_open = True
        while True:
            data = os.read(fd, _READ_BYTES)
            if data:
                tagger.feed(data)
            else:
                tagger.close()
            # Once the reader of `target` has gone (`hvdplusrun ... | head`), keep draining
            # `source` all the same: a full pipe would stop mpiexec, and with it the job.
            if finished and target_open:
                try:
                    target.write(b"".join(finished))
                    target.flush()
                except OSError:
                    target_open = False
            finished.clear()
            if not data:
                break
        source.close()

    thread = threading.Thread(target=relay, name="hvdplusrun-output", daemon=True)
    thread.start()
    return thread
