"""Starting real MPI jobs from single-process tests, always with a timeout."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(nranks, args, env=None, timeout=240, launcher_args=(), python=sys.executable):
    """Run `args` on `nranks` ranks through hvdplusrun (run by `python`); return the
    CompletedProcess.

    A job that outlives `timeout` is killed and reported as a failure, never waited on.
    """
    command = [python, "-m", "hvdplus.runner", "-np", str(nranks), *launcher_args, *args]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def run_pytest_on_ranks(nranks, paths, env=None, timeout=240, python=sys.executable):
    """Run pytest on `paths` in every rank (and the launcher) with `python`; assert all ranks
    passed, showing their output if not."""
    job_env = {"HVDPLUS_MPI_TESTS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    args = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--color=no",
            "--timeout", "120", *paths]
    result = launch(nranks, args, env=job_env, timeout=timeout, python=python)
    assert result.returncode == 0, (
        f"{nranks}-rank pytest of {paths} failed (exit {result.returncode})\n"
        f"--- stdout ---\n{result.stdout[-20000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )
    return result
