"""Starting real MPI jobs from single-process tests, always with a timeout. Tests reach this
through the `mpi_job` fixture (tests/conftest.py)."""

import os
import signal
import subprocess
import sys

import pytest

from testkit import rank_reports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# hvdplusrun ends mpirun's session 10 s after a SIGTERM (runner.supervise's kill_after);
# a launcher that is still there this much later is killed outright.
_TEARDOWN_SECONDS = 20


def launch(nranks, args, env=None, timeout=240, launcher_args=(), python=sys.executable):
    """Run `args` on `nranks` ranks through hvdplusrun (run by `python`); return the
    CompletedProcess.

    A job that outlives `timeout` is ended and reported as a failure, never waited on
    (see run_ending_on_timeout).
    """
    command = [python, "-m", "hvdplus.runner", "-np", str(nranks), *launcher_args, *args]
    return run_ending_on_timeout(command, dict(os.environ, **(env or {})), timeout)


def run_ending_on_timeout(command, env, timeout):
    """Run the launcher `command` from the repository; return the CompletedProcess, or raise
    TimeoutExpired (with the output so far) once the job has been ended after `timeout`.

    It is ended with SIGTERM, which hvdplusrun passes on to mpirun and follows by killing
    mpirun's whole session: a SIGKILL to the launcher alone would leave the ranks running,
    taking the cores from the tests after this one.
    """
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as job:
        try:
            stdout, stderr = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGTERM)
            try:
                stdout, stderr = job.communicate(timeout=_TEARDOWN_SECONDS)
            except subprocess.TimeoutExpired:
                # Whatever still holds the pipes would keep communicate() waiting.
                job.kill()
                job.wait()
                stdout, stderr = "", f"the launcher outlived SIGTERM by {_TEARDOWN_SECONDS} s; killed"
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)


def run_pytest_on_ranks(nranks, paths, env=None, timeout=240, python=sys.executable, pytest_args=()):
    """Run pytest on `paths` in every rank with `python`; fail the calling test naming each
    failed test with its rank and assertion (testkit.rank_reports), else return the RankedRun."""
    run = rank_reports.run_suite_on_ranks(launch, nranks, paths, pytest_args, env=env, timeout=timeout,
                                          python=python)
    if not run.ok:
        pytest.fail(run.describe(), pytrace=False)
    return run


class MpiJob:
    """What the `mpi_job` fixture gives a test: calling it is `launch`; `run_pytest_on_ranks`
    and `run_ending_on_timeout` serve tests that run pytest in every rank or build the
    launcher's command line themselves."""

    __call__ = staticmethod(launch)
    run_pytest_on_ranks = staticmethod(run_pytest_on_ranks)
    run_ending_on_timeout = staticmethod(run_ending_on_timeout)
