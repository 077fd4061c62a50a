"""A rank that exits with an error ends the job at once (hvdplus.runner.exit_guard), in every
form of start: a script, `-m module` and `-c code`, under hvdplusrun and horovodrun."""

import os
import socket
import sys

import pytest

from hvdplus.runner.command import guarded_command

from testkit import timing
from testkit.programs import c_program, program, seconds_since_leaving

GUARD = ["-m", "hvdplus.runner.exit_guard"]
# How soon after a rank exits with an error the job is over, its launcher included.
END_SECONDS = 5


@pytest.mark.parametrize("program, expected", [
    (["python", "train.py", "--lr", "1"], ["python", *GUARD, "train.py", "--lr", "1"]),
    (["python3", "-u", "-W", "ignore", "train.py"], ["python3", "-u", "-W", "ignore", *GUARD, "train.py"]),
    (["/venv/bin/python", "-m", "pkg.train", "-x"], ["/venv/bin/python", *GUARD, "-m", "pkg.train", "-x"]),
    (["python", "-c", "print(1)", "-x"], ["python", *GUARD, "-c", "print(1)", "-x"]),
    # Options run together as Python takes them: the code or module is the rest, else the next argument.
    (["python", "-uc", "print(1)"], ["python", "-u", *GUARD, "-c", "print(1)"]),
    (["python", "-cprint(1)", "-x"], ["python", *GUARD, "-c", "print(1)", "-x"]),
    (["python", "-Wignore", "-Im", "pkg"], ["python", "-Wignore", "-I", *GUARD, "-m", "pkg"]),
    (["python", "-X", "dev", "--", "train.py"], ["python", "-X", "dev", *GUARD, "train.py"]),
    (["python", "-"], ["python", "-"]),
    (["python", "-c"], ["python", "-c"]),
    (["bash", "run.sh"], ["bash", "run.sh"]),
    (["python"], ["python"]),
])
def test_python_programs_run_through_the_guard(program, expected):
    assert guarded_command(program) == expected


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher, start, leaver", [
    ("hvdplus.runner", program, 0), ("hvdplus.runner", program, 1),
    ("hvdplus.runner", c_program, 1), ("hvdplus.runner.horovodrun", c_program, 1),
], ids=["script-rank0", "script-rank1", "c-rank1", "horovodrun-c-rank1"])
def test_a_rank_exiting_with_an_error_ends_the_job_within_seconds(mpi_job, launcher, start, leaver):
    command = [sys.executable, "-m", launcher, "-np", "2",
               *start("one_rank_leaves_early", "--rank", leaver, "--exit", "3", "--others-sleep", "40")]
    result = mpi_job.run_ending_on_timeout(command, dict(os.environ), timeout=50)
    seconds = seconds_since_leaving(result.stdout)
    assert result.returncode == 3, result.stderr[-3000:]
    timing.assert_took_under(seconds, END_SECONDS, quiet=0.6, what=f"the job ending after rank {leaver} left")
    # The launcher's summary names the rank and its status (hvdplus.runner.failure_summary).
    assert f"rank {leaver} on host {socket.gethostname()}: exited with status 3" in result.stderr, result.stderr


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_clean_early_exit_still_waits_for_the_others(mpi_job):
    result = mpi_job(2, program("one_rank_leaves_early", "--rank", "1", "--exit", "0", "--others-sleep", "2"),
                     timeout=50)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 finished its work" in result.stdout
