"""Elastic PyTorch jobs that lose (or gain) ranks: tests/elastic_jobs/torch_train.py under
hvdplusrun's elastic mode, checked against tests/elastic_jobs/replay.py.

Every job must end with exit 0, every sample committed exactly once per epoch, and the
final weights equal to a numpy replay of the steps it committed, at the sizes expected."""

import os
import signal
import sys

import pytest

from elastic_jobs import replay
from testkit.programs import program
from testkit.stopping import assert_stops_at_once, start_stepping, start_waiting_to_restart

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(200)]

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "elastic_jobs", "torch_train.py")
STEPS_PER_EPOCH_AT_3 = 8  # 96 samples in batches of 4 per rank


def run_elastic(mpi_job, tmp_path, nranks, job_args=(), launcher_args=("--min-np", "1")):
    out = str(tmp_path / "result.json")
    result = mpi_job(nranks, [sys.executable, SCRIPT, out, *job_args], launcher_args=list(launcher_args),
                     timeout=150)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    assert os.path.exists(out), output
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    return trained, output


def sizes_change(trained, before, after, at):
    sizes = replay.sizes(trained)
    return sizes[:at] == [before] * at and set(sizes[at:]) == {after}


@pytest.mark.parametrize("victim", [0, 1])
def test_in_place_after_a_rank_dies_between_steps(mpi_job, tmp_path, victim):
    trained, output = run_elastic(mpi_job, tmp_path, 3, ["--kill", f"{victim}:5:step"])
    assert sizes_change(trained, 3, 2, 5), replay.sizes(trained)
    assert trained["resets"] == [2]
    assert f"ranks [{victim}] of 3 died; the other 2 re-formed the job" in output


def test_in_place_when_a_rank_dies_with_its_all_reduces_in_flight(mpi_job, tmp_path):
    trained, _ = run_elastic(mpi_job, tmp_path, 3, ["--kill", "2:3:backward"])
    assert sizes_change(trained, 3, 2, 3), replay.sizes(trained)


def test_in_place_when_a_rank_dies_inside_commit(mpi_job, tmp_path):
    # The victim saved step 4 but the others may not have: all roll back to the same commit.
    trained, _ = run_elastic(mpi_job, tmp_path, 3, ["--kill", "1:4:commit"])
    sizes = replay.sizes(trained)
    assert sizes[0] == 3 and sizes[-1] == 2 and sizes.count(3) in (3, 4), sizes


def test_two_ranks_die_at_once(mpi_job, tmp_path):
    trained, _ = run_elastic(mpi_job, tmp_path, 3, ["--kill", "1:4:step", "--kill", "2:4:step"])
    assert sizes_change(trained, 3, 1, 4), replay.sizes(trained)


def test_a_rank_dies_while_the_others_sync_after_a_re_form(mpi_job, tmp_path):
    # Rank 2 dies at step 3; in the broadcast that re-syncs the survivors, rank 1 dies too.
    trained, _ = run_elastic(mpi_job, tmp_path, 3, ["--kill", "2:3:step", "--kill", "1:3:sync"])
    assert sizes_change(trained, 3, 1, 3), replay.sizes(trained)


def test_a_rank_that_dies_after_the_last_commit_costs_nothing(mpi_job, tmp_path):
    trained, _ = run_elastic(mpi_job, tmp_path, 3, ["--kill", f"2:{2 * STEPS_PER_EPOCH_AT_3}:end"])
    assert set(replay.sizes(trained)) == {3}
    assert trained["resets"] == []


def test_restart_resumes_from_the_commit_on_disk(mpi_job, tmp_path):
    trained, output = run_elastic(mpi_job, tmp_path, 3, ["--kill", "1:5:step"],
                                  launcher_args=["--min-np", "2", "--no-in-place"])
    assert sizes_change(trained, 3, 2, 5), replay.sizes(trained)
    assert trained["resets"] == [2], "the reset callbacks run after a restart from disk too"
    assert "hvdplusrun: ranks [1] died; restart 1 of at most 3" in output


def test_too_few_survivors_restart_after_waiting_for_slots(mpi_job, tmp_path):
    # Two of three die, leaving fewer than --min-np 2: the launcher restarts on the slot left...
    # which is not enough either, so it gives up after --elastic-timeout.
    out = str(tmp_path / "result.json")
    result = mpi_job(3, [sys.executable, SCRIPT, out, "--kill", "1:2:step", "--kill", "2:2:step"],
                     launcher_args=["--min-np", "2", "--elastic-timeout", "2"], timeout=120)
    assert result.returncode == 2, result.stderr[-4000:]
    assert "fewer than --min-np 2" in result.stderr


def test_growing_restarts_on_the_new_slots_at_a_commit(mpi_job, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    trained, output = run_elastic(
        mpi_job, tmp_path, 2, ["--grow", f"{hosts}:4:3", "--step-seconds", "0.1"],
        launcher_args=["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(discover)])
    sizes = replay.sizes(trained)
    assert sizes[0] == 2 and sizes[-1] == 3 and sizes == sorted(sizes), sizes
    assert "restarting the job on the new slots" in output


def test_an_error_is_not_taken_for_a_failure(mpi_job):
    # Under ULFM the ranks report deaths themselves: a launch that aborts on an uncaught
    # exception ends the elastic job with its status, without restarting it.
    result = mpi_job(2, program("elastic_job_with_a_bug"), launcher_args=["--min-np", "1"], timeout=60)
    assert result.returncode != 0
    assert "KeyError: 'a bug in the training script'" in result.stderr
    assert "restart" not in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_step_ends_a_restarting_job_without_a_restart(mpi_job, tmp_path, signum):
    with start_stepping(mpi_job, tmp_path, ["--elastic"], ["--min-np", "1", "--no-in-place"]) as job:
        assert_stops_at_once(job, signum, tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_launcher_waits_to_restart_ends_the_job(mpi_job, tmp_path, signum):
    with start_waiting_to_restart(mpi_job, tmp_path) as job:
        assert_stops_at_once(job, signum, tmp_path)
