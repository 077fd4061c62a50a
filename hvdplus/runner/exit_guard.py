"""Run a rank's Python program so that an error exit ends the whole job at once.

    python -m hvdplus.runner.exit_guard train.py --lr 0.1
    python -m hvdplus.runner.exit_guard -m package.train --lr 0.1
    python -m hvdplus.runner.exit_guard -c "import train; train.main()" --lr 0.1

A rank that calls `sys.exit(3)` while its peers compute would otherwise run its exit
handlers into MPI_Finalize (or the collective free of hvdplus' shared window), which waits
for every other rank to get there too: the job only ends when the others next communicate
or finish, and mpirun never sees the error until then. Here a non-zero exit of a rank
whose MPI is running skips those handlers (after flushing its output): the process ends
with its status, and mpirun ends the job (or, in an elastic job, the others re-form it).

`hvdplusrun` starts Python programs through this module (command.guarded_command), unless
given `--no-exit-guard`; nothing else imports it: `python -m` runs it fresh. Under a plain
mpirun, name it in the command line as above.

An uncaught exception, under hvdplusrun, goes to the launcher instead of the terminal: the
rank sends its report (hvdplus.common.rank_errors: host, exception, the user's line, the
traceback without this module's and runpy's frames) and ends the job with MPI_Abort, and the
launcher prints one summary of the failed job. A rank that exits with an error reports its
status the same way. Under a plain mpirun the exception keeps its usual path (hvdplus'
excepthook prints the traceback and aborts the job); under hvdplusrun's `--verbose` it takes
that path after the report.
"""

import os
import runpy
import sys
import time
import types
from typing import Optional

from ..common import launcher_messages, rank_errors, stop_requests
from ..common.settings import Settings

__all__ = ["main"]

def _mpi_is_running() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")  # never imported here: only looked at if the rank did
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def _reporting_rank() -> Optional[int]:
    """This rank's number where the launcher collects the ranks' failures; None where none does."""
    return rank_errors.rank_in_job() if rank_errors.report_mode() is not None else None


def _report(failure: rank_errors.RankFailure) -> None:
    launcher_messages.send(failure.to_message())
    if _mpi_is_running():
        # MPI_Abort, or mpirun noticing the exit, may end this process before mpirun has read it.
        time.sleep(rank_errors.DELIVERY_SECONDS)


def _abort_job(status: int) -> None:
    """End this rank with `status` and, where its MPI runs, the whole job (MPI_Abort), as hvdplus'
    excepthook does: the other ranks may wait for this one in a collective."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _mpi_is_running():
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(status)
    raise SystemExit(status)


def _status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits with 1
    return 1


def _run_code(code: str) -> None:
    """Run `code` as `python -c` does: in a fresh `__main__` module, named <string> in
    tracebacks; this module is `__main__` again afterwards, as runpy leaves it for a script."""
    module = types.ModuleType("__main__")
    guard, sys.modules["__main__"] = sys.modules["__main__"], module
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = guard


def _keep_stop_signals() -> None:
    """A scheduler's warning (SIGUSR1) may come while the program still imports: keep it for
    hvd.elastic.run rather than die of it (hvdplus.common.stop_requests)."""
    try:
        names = Settings.from_env().stop_signals
    except ValueError:
        return  # hvd.init() raises it, where the program can see it
    stop_requests.install(names, at_init=True)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    _keep_stop_signals()
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            _run_code(argv[1])
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        status = _status(exit.code)
        rank = _reporting_rank()
        if status != 0 and rank is not None:
            _report(rank_errors.exit_report(rank, status, "" if isinstance(exit.code, int) else str(exit.code)))
        if status != 0 and _mpi_is_running():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        raise
    except Exception as error:
        rank = _reporting_rank()
        if rank is None:
            raise
        _report(rank_errors.raised_report(error, rank, exit_code=1))
        if rank_errors.report_mode() == rank_errors.SEND_AND_PRINT:
            raise  # printed, and the job aborted, as without a launcher
        _abort_job(1)


if __name__ == "__main__":
    main()
