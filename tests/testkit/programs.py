"""The programs under tests/jobs/, which tests run as MPI jobs or in fresh interpreters: one
file each, so they are linted like the rest of the code."""

import os
import re
import sys
import time

FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs")
# A `python -c` program that runs a job file given as its first argument.
_RUN_FILE = "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')"


def program(name, *args, python=sys.executable):
    """The command line that runs tests/jobs/<name>.py with `args` on `python` (this interpreter)."""
    return [python, os.path.join(FOLDER, f"{name}.py"), *map(str, args)]


def c_program(name, *args, python=sys.executable):
    """`program`, started as `python -c CODE ...`: for tests of how hvdplusrun starts such programs."""
    python, *rest = program(name, *args, python=python)
    return [python, "-c", _RUN_FILE, *rest]


def seconds_since_leaving(output):
    """Seconds from the exit of one_rank_leaves_early.py's leaving rank, whose line in `output`
    says when it left, to now."""
    left = re.search(r"rank \d leaves at ([\d.]+)", output)
    assert left, output
    return time.time() - float(left.group(1))
