"""What a rank tells the launcher when it fails: the exception it raised, or the status it exits with.

The launcher prints one summary of a failed job from these reports (hvdplus.runner.failure_summary),
so each report carries what the summary names: the rank, its host, the exception's type and
message, the user's line it was raised at, the traceback without the frames that started the
user's code (runpy's, the exit guard's, hvdplus.run_rank's), and the exit code. A report travels
as one launcher message (launcher_messages); `RankFailure` is its typed form on both sides.

`hvdplusrun` asks its ranks for reports through REPORT_ENV: "send" (the rank sends the report and
prints no traceback, the launcher prints the summary) or "send-and-print" (`--verbose`: the rank
also prints what it always did). Unset (plain mpirun), a rank prints as before and sends nothing.
"""

import dataclasses
import os
import socket
import sys
import sysconfig
import traceback
from typing import Dict, Optional, Tuple

__all__ = ["REPORT_ENV", "SEND", "SEND_AND_PRINT", "DELIVERY_SECONDS", "RankFailure", "report_mode", "rank_in_job",
           "trimmed_traceback", "raised_at", "raised_report", "exit_report"]

REPORT_ENV = "HVDPLUS_RANK_ERRORS"
SEND, SEND_AND_PRINT = "send", "send-and-print"
# How long a rank that has sent its report waits before it ends the job: MPI_Abort, or mpirun
# noticing its exit, may end its processes before mpirun has read the report.
DELIVERY_SECONDS = 0.2
# The longest traceback sent whole (a message is one line, which the launcher takes up to 64 KiB
# long); a longer one loses its middle.
TRACEBACK_CHARS = 32 * 1024
# The code that starts the user's: its frames open every traceback, and say nothing of the error.
_LAUNCHER_FILES = (os.path.join("hvdplus", "runner", "exit_guard.py"), os.path.join("hvdplus", "run_rank.py"))
_RUNPY_FILES = ("<frozen runpy>", os.sep + "runpy.py")
# Where code that is not the user's lives: the line a summary names is the innermost one outside these.
_LIBRARY_DIRS = tuple(os.path.join(os.path.realpath(path), "") for path in {
    *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # hvdplus itself
})


@dataclasses.dataclass
class RankFailure:
    """One rank's failure: what it raised (`type`, `message`, `traceback`; `type` is empty for a
    rank that exited with an error without raising), on which host, at which of the user's
    lines (`file`, `line`), and the status it exits with (None when not known)."""

    rank: int
    type: str
    message: str
    traceback: str
    host: str = ""
    file: str = ""
    line: int = 0
    exit_code: Optional[int] = None

    def to_message(self) -> Dict:
        """The launcher message that carries it: keyed "error" for an exception, else "exited"."""
        fields = dataclasses.asdict(self)
        return {"error" if self.type else "exited": fields.pop("rank"), **fields}

    @classmethod
    def from_message(cls, message: Dict) -> Optional["RankFailure"]:
        """The failure `message` reports, or None for another message."""
        key = "error" if "error" in message else "exited" if "exited" in message else None
        if key is None:
            return None
        exit_code = message.get("exit_code")
        return cls(int(message[key]), str(message.get("type") or ""), str(message.get("message", "")),
                   str(message.get("traceback", "")), str(message.get("host", "")), str(message.get("file", "")),
                   int(message.get("line") or 0), None if exit_code is None else int(exit_code))


def report_mode(environ=os.environ) -> Optional[str]:
    """SEND or SEND_AND_PRINT when the launcher collects reports; None when none listens."""
    mode = environ.get(REPORT_ENV)
    return mode if mode in (SEND, SEND_AND_PRINT) else None


def rank_in_job() -> Optional[int]:
    """This process's rank: hvdplus's (after an elastic re-form, the rank of the job as it stands),
    else MPI_COMM_WORLD's, else what the MPI launcher told it; None outside a job. Modules are only
    looked at if the process imported them: nothing here starts MPI."""
    runtime = sys.modules.get("hvdplus.core.runtime")
    if runtime is not None and runtime.is_initialized():
        return runtime.rank()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _is_launcher_frame(frame: traceback.FrameSummary) -> bool:
    return frame.filename.endswith(_RUNPY_FILES) or frame.filename.endswith(_LAUNCHER_FILES)


def trimmed_traceback(error: BaseException) -> str:
    """`error`'s traceback as Python prints it, less the frames of the code that ran the user's."""
    summary = traceback.TracebackException(type(error), error, error.__traceback__)
    # Only the outermost stack opens with them: chained exceptions' stacks start where they were caught.
    stack = summary.stack
    del stack[:next((index for index, frame in enumerate(stack) if not _is_launcher_frame(frame)), len(stack))]
    text = "".join(summary.format())
    if len(text) > TRACEBACK_CHARS:
        text = text[:TRACEBACK_CHARS // 2] + "\n...\n" + text[-TRACEBACK_CHARS // 2:]
    return text


def _is_library_file(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return True
    return filename.startswith("/") and os.path.join(os.path.realpath(filename), "").startswith(_LIBRARY_DIRS)


def raised_at(error: BaseException) -> Tuple[str, int]:
    """The user's (file, line) where `error` was raised: the innermost frame outside Python's
    library, the installed packages and hvdplus, else the innermost frame; ("", 0) without one.
    A syntax error names the line it found."""
    if isinstance(error, SyntaxError) and error.filename:
        return error.filename, error.lineno or 0
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not _is_launcher_frame(frame)]
    own = [frame for frame in frames if not _is_library_file(frame.filename)]
    chosen = (own or frames or [None])[-1]
    return (chosen.filename, chosen.lineno or 0) if chosen is not None else ("", 0)


def raised_report(error: BaseException, rank: int, exit_code: Optional[int]) -> RankFailure:
    """The report of `error`, raised on `rank`, which then exits with `exit_code`."""
    file, line = raised_at(error)
    return RankFailure(rank, type(error).__qualname__, str(error), trimmed_traceback(error),
                       socket.gethostname(), file, line, exit_code)


def exit_report(rank: int, exit_code: int, message: str = "") -> RankFailure:
    """The report of `rank` exiting with `exit_code` (`sys.exit(3)`; `message` for `sys.exit("text")`)."""
    return RankFailure(rank, "", message, "", socket.gethostname(), exit_code=exit_code)
