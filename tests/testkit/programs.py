"""The programs under tests/jobs/, which tests run as MPI jobs or in fresh interpreters: one
file each, so they are linted like the rest of the code."""

import os
import sys

FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs")
# hvdplusrun starts `python -c` programs as they are, without its exit guard
# (hvdplus.runner.command.guarded_command): this one runs a job file from there.
_RUN_FILE = "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')"


def program(name, *args, python=sys.executable):
    """The command line that runs tests/jobs/<name>.py with `args` on `python` (this interpreter)."""
    return [python, os.path.join(FOLDER, f"{name}.py"), *map(str, args)]


def unguarded_program(name, *args):
    """`program`, started through `python -c` so that hvdplusrun leaves out its exit guard:
    for tests of what MPI and the other ranks do when a rank exits with an error, as under
    a plain mpirun."""
    python, *rest = program(name, *args)
    return [python, "-c", _RUN_FILE, *rest]
