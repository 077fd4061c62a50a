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
mpirun, name it in the command line as above. Uncaught exceptions keep their usual path
(hvdplus' excepthook aborts the job after printing the traceback).
"""

import os
import runpy
import sys
import types

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


def _run_code(code: str) -> None:
    """Run `code` as `python -c` does: in a fresh `__main__` module, named <string> in
    tracebacks; this module is `__main__` again afterwards, as runpy leaves it for a script."""
    module = types.ModuleType("__main__")
    guard, sys.modules["__main__"] = sys.modules["__main__"], module
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = guard


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
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
        if status != 0 and _mpi_is_running():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        raise


if __name__ == "__main__":
    main()
