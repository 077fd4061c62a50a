"""Run a rank's Python program so that an error exit ends the whole job at once.

    python -m hvdplus.runner.exit_guard train.py --lr 0.1
    python -m hvdplus.runner.exit_guard -m package.train --lr 0.1

A rank that calls `sys.exit(3)` while its peers compute would otherwise run its exit
handlers into MPI_Finalize (or the collective free of hvdplus' shared window), which waits
for every other rank to get there too: the job only ends when the others next communicate
or finish, and mpirun never sees the error until then. Here a non-zero exit of a rank
whose MPI is running skips those handlers (after flushing its output): the process ends
with its status, and mpirun ends the job (or, in an elastic job, the others re-form it).

`hvdplusrun` starts Python programs through this module (command.guarded_command), which
nothing else imports: `python -m` runs it fresh. Uncaught exceptions keep their usual path
(hvdplus' excepthook aborts the job after printing the traceback).
"""

import os
import runpy
import sys

__all__ = ["main"]

def _mpi_is_running() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")  # never imported here: only looked at if the rank did
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def _status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits with 1
    return 1


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        status = _status(exit.code)
        if status != 0 and _mpi_is_running():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        raise


if __name__ == "__main__":
    main()
