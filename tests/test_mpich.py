"""The framework-free suites under tests/mpi/ in jobs on MPICH, the other MPI hvdplus supports,
and what MPICH's hydra does differently from Open MPI: how a job ends on a signal to the
launcher or on a rank exiting with an error.

These jobs run in MPICH's environment of their own (tests/testkit/mpich.py, the
`mpich_python` fixture). The suites' torch and TensorFlow files skip there, having no
framework to import.
"""

import os
import re
import signal
import subprocess

import pytest

from testkit import timing
from testkit.mpi_jobs import REPO
from testkit.mpich import mpich_job_env
from testkit.programs import c_program, seconds_since_leaving
from testkit.stopping import assert_stops_at_once, start_committing, start_stepping, start_waiting_to_restart

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

@pytest.mark.timeout(900)  # the first test builds the environment
def test_hvdplusrun_finds_mpich_there(mpich_python):
    env = dict(os.environ, **mpich_job_env(mpich_python))
    result = subprocess.run([mpich_python, "-m", "hvdplus.runner", "--check-build"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MPICH" in result.stdout and "Open MPI" not in result.stdout, result.stdout


@pytest.mark.timeout(300)
# An odd size, which breaks ring and split arithmetic first; the tests below run jobs of two. The
# framework-free suites run at 4 ranks (a power of two) on Open MPI (tests/test_mpi_suites.py).
@pytest.mark.parametrize("nranks", [3])
def test_core_suites_on_mpich(mpi_job, mpich_python, nranks):
    # The algorithms' grid of pairs (tests/mpi/test_algorithms.py): the whole one runs on Open MPI.
    env = dict(mpich_job_env(mpich_python), HVDPLUS_TEST_GRID="pairs")
    run = mpi_job.run_pytest_on_ranks(nranks, ["tests/mpi"], env=env, python=mpich_python)
    assert run.counts["passed"] > 100 * nranks, run.describe()
    # Whole lines tagged by hvdplusrun from hydra's marked pieces: no marker left over.
    assert "\x1f" not in run.output
    for rank in range(nranks):
        assert re.search(rf"^\[{rank}\] rank {rank}: \d+ passed", run.output, re.M), run.output[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", ["step", "elastic-step", "commit", "restart"])
def test_a_signal_ends_the_job_without_a_restart(mpi_job, mpich_python, tmp_path, moment, signum):
    # Without failure mitigation an elastic job restarts after any failed launch: one that a
    # signal ended must not count as one.
    env = mpich_job_env(mpich_python)
    if moment == "restart":
        job = start_waiting_to_restart(mpi_job, tmp_path, python=mpich_python, env=env)
    elif moment == "commit":
        job = start_committing(mpi_job, tmp_path, python=mpich_python, env=env)
    elif moment == "elastic-step":
        job = start_stepping(mpi_job, tmp_path, ["--elastic"], ["--min-np", "1"], python=mpich_python, env=env)
    else:
        job = start_stepping(mpi_job, tmp_path, python=mpich_python, env=env)
    with job:
        assert_stops_at_once(job, signum, tmp_path)


@pytest.mark.timeout(120)
def test_a_python_c_rank_exiting_with_an_error_ends_the_job_within_seconds(mpi_job, mpich_python):
    program = c_program("one_rank_leaves_early", "--rank", "1", "--exit", "3", "--others-sleep", "40",
                        python=mpich_python)
    result = mpi_job(2, program, env=mpich_job_env(mpich_python), timeout=60, python=mpich_python)
    seconds = seconds_since_leaving(result.stdout)
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    timing.assert_took_under(seconds, 5, quiet=0.4, what="an MPICH job ending after rank 1 left")
