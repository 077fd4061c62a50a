"""Elastic PyTorch jobs that lose (or gain) ranks: tests/elastic_jobs/torch_train.py under
hvdplusrun's elastic mode, checked against tests/elastic_jobs/replay.py. The fault matrix,
every victim at every moment in every mode, is tests/test_elastic_faults.py's.

Every job must end with exit 0, every sample committed exactly once per epoch, and the
final weights equal to a numpy replay of the steps it committed, at the sizes expected."""

import os
import re
import signal
import sys

import pytest

from elastic_jobs import replay
from testkit.discovery import discovery_script
from testkit.programs import program
from testkit.stopping import assert_stops_at_once, start_committing, start_stepping, start_waiting_to_restart

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
    # With a LoadBalancer beside, which raises in the job where its sizes miss the re-form.
    trained, output = run_elastic(mpi_job, tmp_path, 3, ["--kill", f"{victim}:5:step", "--balancer"])
    assert sizes_change(trained, 3, 2, 5), replay.sizes(trained)
    assert trained["resets"] == [2]
    assert f"ranks [{victim}] of 3 died; the other 2 re-formed the job" in output


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
    # The wait is said when it starts, not only when it ends.
    assert re.search(r"only 1 usable slots, fewer than --min-np 2; waiting up to \d s more for hosts\n"
                     r"(.*\n)*.*only 1 usable slots, fewer than --min-np 2, after waiting 2 s", result.stderr), \
        result.stderr[-4000:]


def test_growing_restarts_on_the_new_slots_at_a_commit(mpi_job, tmp_path):
    hosts, discover = discovery_script(tmp_path, 2)
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
@pytest.mark.parametrize("mode, moment", [("in-place", "step"), ("in-place", "commit"), ("restart", "step"),
                                          ("restart", "commit"), ("restart", "waiting-to-restart")])
def test_a_signal_ends_the_job_without_a_restart(mpi_job, tmp_path, mode, moment, signum):
    launcher_args = ["--min-np", "1"] + (["--no-in-place"] if mode == "restart" else [])
    if moment == "waiting-to-restart":
        job = start_waiting_to_restart(mpi_job, tmp_path)
    elif moment == "commit":
        job = start_committing(mpi_job, tmp_path, launcher_args)
    else:
        job = start_stepping(mpi_job, tmp_path, ["--elastic"], launcher_args)
    with job:
        assert_stops_at_once(job, signum, tmp_path)
