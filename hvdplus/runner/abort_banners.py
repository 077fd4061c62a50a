"""MPI's messages about an aborted job, each folded into one line of the launcher's output.

When a rank calls MPI_Abort, Open MPI prints a block of about ten lines between lines of dashes
("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD ...") from the rank, and prterun
another ("prterun has exited due to process rank 1 ... calling "abort""), as it does when a
rank exits with an error ("prterun detected that one or more processes exited ..."); MPICH
prints "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(...) - process 1"
for each rank that aborts. hvdplusrun's summary of the failed job already says which rank failed and why, so
`AbortBannerFolder` writes each of Open MPI's blocks as one line (its rank tag kept) and MPICH's
lines as the first of them; every other block and line passes unchanged. `--verbose` leaves them
all whole.

A line of dashes waits for the line after it from the same rank (or from mpirun), which tells
whether a block of MPI's starts; output that cannot start or continue a block passes at once,
unfinished lines (a progress bar's) included. The stream is left at the start of a line, for
the launcher's summary to follow.
"""

import re
import threading
from typing import BinaryIO, Dict, List, Optional

__all__ = ["AbortBannerFolder"]

# The tag that Open MPI ("[1,0]<stderr>: ") or hvdplusrun's tagging of MPICH's lines ("[0] ") put first.
_TAG = re.compile(rb"\[\d+(?:,\d+)?\](?:<\w+>:)? ?")
# What a read may cut such a tag down to.
_TAG_SO_FAR = re.compile(rb"\[[\d,]*(?:\](?:<\w*(?:>:?)?)?)?")
_DASHES = re.compile(rb"-{20,}\s*")
_DASHES_SO_FAR = re.compile(rb"-*")
# What Open MPI leaves after the last line of its message from a rank: the tag and the C string's NUL.
_NUL_REMNANT = re.compile(rb"(?:\[\d+(?:,\d+)?\](?:<\w+>:)? ?)?\x00+")
# The first line of the blocks that may be about an abort, and what makes one so.
_BLOCK_OPENING = re.compile(rb"MPI_ABORT was invoked|has exited due to process rank|detected that one or more "
                            rb"processes exited with non-zero status")
_OPEN_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+) in communicator (\S+)")
_ERROR_CODE = re.compile(r"[Ee]rrorcode:? (\d+)")
_LAUNCHER_ABORT = re.compile(r"^(.*? calling \"abort\")")
# mpirun's block when a rank exits with an error, which the exit guard makes it do.
_LAUNCHER_SAW_EXIT = re.compile(r"^(\S+ detected that one or more processes exited with non-zero status).*?"
                                r"Process name: (\S+) Exit code: (\d+)")
# MPICH's line, from each rank that calls MPI_Abort, and how it may start.
_MPICH_ABORT = re.compile(rb"(?:Abort\(\d+\)[^:\n]*: )?application called MPI_Abort\(")
_MPICH_ABORT_STARTS = (b"Abort(", b"application called MPI_Abort(")
# A block longer than any of MPI's is passed on as it is.
_LONGEST_BLOCK_LINES = 40
_LONGEST_HELD_BYTES = 4096
_FOLDED_NOTE = " (MPI's message folded; --verbose shows it whole)"


def _split_tag(line: bytes):
    match = _TAG.match(line)
    end = match.end() if match else 0
    return line[:end], line[end:]


def _folded(tag: bytes, block: List[bytes]) -> Optional[bytes]:
    """The one line for `block` (its lines of dashes first and last), or None when it is no
    message about an abort or a rank's exit with an error."""
    text = " ".join(line[len(tag):].decode(errors="replace").strip() for line in block[1:-1])
    text = " ".join(text.split())
    rank_abort = _OPEN_MPI_ABORT.search(text)
    if rank_abort:
        code = _ERROR_CODE.search(text)
        said = f"MPI_ABORT was invoked on rank {rank_abort.group(1)} in communicator {rank_abort.group(2)}"
        said += f" with errorcode {code.group(1)}" if code else ""
    elif _LAUNCHER_SAW_EXIT.search(text):
        detected, process, code = _LAUNCHER_SAW_EXIT.search(text).groups()
        said = f"{detected}: first {process}, exit code {code}"
    elif _LAUNCHER_ABORT.search(text):
        said = _LAUNCHER_ABORT.search(text).group(1)
    else:
        return None
    return tag + (said + _FOLDED_NOTE).encode() + b"\n"


class AbortBannerFolder:
    """Writes to `target` (a binary stream) what is written to it, MPI's abort messages folded.

    Thread-safe; `close` writes what is still held back, and passes later writes on unchanged.
    """

    def __init__(self, target: BinaryIO):
        self._target = target
        self._lock = threading.Lock()
        self._unfinished = b""  # the start of a line that may still begin or continue a block
        self._mid_line = False  # the start of the current line was passed on: so is the rest of it
        self._blocks: Dict[bytes, List[bytes]] = {}  # by tag: the lines of a block read so far
        self._mpich_abort_seen = False
        self._closed = False

    def write(self, data: bytes) -> None:
        with self._lock:
            out = data if self._closed else self._feed(data)
        if out:
            self._target.write(out)

    def flush(self) -> None:
        self._target.flush()

    def close(self) -> None:
        """Write what is held back (a block the stream ended in, unfolded), and end the last line."""
        with self._lock:
            unfinished = b"" if _NUL_REMNANT.fullmatch(self._unfinished) else self._unfinished
            held = b"".join(line for block in self._blocks.values() for line in block) + unfinished
            if self._mid_line and held:
                held = b"\n" + held
            if (held or self._mid_line) and not held.endswith(b"\n"):
                held += b"\n"
            self._blocks.clear()
            self._unfinished, self._closed = b"", True
        try:
            if held:
                self._target.write(held)
            self._target.flush()
        except Exception:  # noqa: BLE001 - a reader gone loses only what it would not read
            pass

    def _feed(self, data: bytes) -> bytes:
        data, self._unfinished = self._unfinished + data, b""
        out: List[bytes] = []
        start = 0
        if self._mid_line:
            end = data.find(b"\n")
            if end < 0:
                return data
            out.append(data[:end + 1])
            start, self._mid_line = end + 1, False
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            out.append(self._line(data[start:end + 1]))
            start = end + 1
        rest = data[start:]
        if rest and self._may_hold(rest):
            self._unfinished = rest
        elif rest:
            out.append(rest)
            self._mid_line = True
        return b"".join(out)

    def _may_hold(self, unfinished: bytes) -> bool:
        """Whether `unfinished` may yet be a line of a block or one of MPICH's: a tag so far, dashes
        or MPICH's words so far, or a line of a source whose block is open."""
        if len(unfinished) > _LONGEST_HELD_BYTES:
            return False
        if _TAG_SO_FAR.fullmatch(unfinished) or _NUL_REMNANT.fullmatch(unfinished):
            return True
        tag, body = _split_tag(unfinished)
        return (tag in self._blocks or _DASHES_SO_FAR.fullmatch(body) is not None
                or any(start.startswith(body) or body.startswith(start) for start in _MPICH_ABORT_STARTS))

    def _line(self, line: bytes) -> bytes:
        """What to write for one whole line: nothing while a block holds it."""
        tag, body = _split_tag(line)
        block = self._blocks.get(tag)
        if block is None:
            if _DASHES.fullmatch(body):
                self._blocks[tag] = [line]
                return b""
            if _MPICH_ABORT.match(body):
                seen, self._mpich_abort_seen = self._mpich_abort_seen, True
                return b"" if seen else line
            return line
        if len(block) == 1 and not _BLOCK_OPENING.search(body):
            del self._blocks[tag]
            if _DASHES.fullmatch(body):  # a line of dashes again: it may open a block itself
                self._blocks[tag] = [line]
                return block[0]
            return block[0] + line
        block.append(line)
        if _DASHES.fullmatch(body):
            del self._blocks[tag]
            return _folded(tag, block) or b"".join(block)
        if len(block) > _LONGEST_BLOCK_LINES:
            del self._blocks[tag]
            return b"".join(block)
        return b""
