"""A rank that exits with an error ends the job at once (hvdplus.runner.exit_guard)."""

import time

import pytest

from hvdplus.runner.command import guarded_command

from testkit.programs import program

GUARD = ["-m", "hvdplus.runner.exit_guard"]


@pytest.mark.parametrize("program, expected", [
    (["python", "train.py", "--lr", "1"], ["python", *GUARD, "train.py", "--lr", "1"]),
    (["python3", "-u", "-W", "ignore", "train.py"], ["python3", "-u", "-W", "ignore", *GUARD, "train.py"]),
    (["/venv/bin/python", "-m", "pkg.train", "-x"], ["/venv/bin/python", *GUARD, "-m", "pkg.train", "-x"]),
    (["python", "-c", "print(1)"], ["python", "-c", "print(1)"]),
    (["bash", "run.sh"], ["bash", "run.sh"]),
    (["python"], ["python"]),
])
def test_python_programs_run_through_the_guard(program, expected):
    assert guarded_command(program) == expected


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("leaver", [0, 1])
def test_a_rank_exiting_with_an_error_ends_the_job_within_seconds(mpi_job, leaver):
    started = time.monotonic()
    result = mpi_job(2, program("one_rank_leaves_early", "--rank", leaver, "--exit", "3", "--others-sleep", "40"),
                     timeout=50)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr[-3000:]
    assert elapsed < 15, f"the job took {elapsed:.1f} s to end"


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_clean_early_exit_still_waits_for_the_others(mpi_job):
    result = mpi_job(2, program("one_rank_leaves_early", "--rank", "1", "--exit", "0", "--others-sleep", "2"),
                     timeout=50)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 finished its work" in result.stdout
