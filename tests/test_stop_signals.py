"""A stop signal to the launcher or to one rank stops every rank of `hvd.elastic.run` at the
same commit, written to --commit-dir; the next job with that folder resumes there, and no
step runs twice (tests/containers/resumable_training.py, whose logs say which steps ran).
On this machine, without Slurm; tests/test_slurm.py does the same on a Slurm cluster."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from testkit.cluster import REPO
from testkit.training_logs import final_result, read_step_log

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

PROGRAM = os.path.join(REPO, "tests", "containers", "resumable_training.py")
STEPS = 24


def launcher(nranks, folder, *extra, step_seconds=0.4):
    return [sys.executable, "-m", "hvdplus.runner", "-np", str(nranks), "--commit-dir", str(folder / "commits"),
            *extra, sys.executable, PROGRAM, "--steps", str(STEPS), "--step-seconds", str(step_seconds),
            "--log-dir", str(folder / "logs"), "--ready-file", str(folder / "ready")]


# The launcher holds SIGUSR1 until mpirun has run 5 s (supervise.PASS_ON_AFTER_SECONDS): 24
# steps of 0.4 s outlast that.
def wait_for(path, process, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} not within {timeout} s"
        time.sleep(0.1)


def rank_pids(folder):
    """The training ranks' process ids, from their log files' names (<host>.<pid>.log)."""
    return sorted(int(name.split(".")[-2]) for name in os.listdir(folder / "logs"))


@pytest.mark.parametrize("nranks, target", [(2, "launcher"), (3, "rank 2")])
def test_a_stop_signal_stops_every_rank_at_one_commit_and_the_next_job_resumes_there(tmp_path, nranks, target):
    first = subprocess.Popen(launcher(nranks, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(tmp_path / "ready", first)
        time.sleep(0.5)
        first.send_signal(signal.SIGUSR1) if target == "launcher" else os.kill(rank_pids(tmp_path)[2], signal.SIGUSR1)
        output, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0, output
    assert "SIGUSR1 asked the job to stop; every rank stopped at commit" in output, output
    stopped = read_step_log(tmp_path / "logs")
    assert 0 < len(stopped.steps()) < STEPS, f"the first job ran steps {stopped.steps()}:\n{output}"
    # Every rank ran the same steps: none stopped a step early or late.
    assert all(stopped.runs[step, nranks] == nranks for step in stopped.steps()), stopped.runs
    assert os.listdir(tmp_path / "commits") == ["state-0.commit"]

    second = subprocess.run(launcher(nranks, tmp_path, step_seconds=0.0), capture_output=True, text=True,
                            timeout=120)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output
    log = read_step_log(tmp_path / "logs")
    log.check_complete(STEPS)
    assert log.repeated() == [], f"steps that ran twice: {log.repeated()}"
    assert final_result(output)["steps"] == STEPS
    np.testing.assert_allclose(final_result(output)["weights"], log.replayed_weights(), rtol=1e-12)


def test_stop_signals_none_leaves_usr1_to_the_program(tmp_path):
    # With no stop signals, SIGUSR1 is the program's business: here, its default action ends the rank.
    first = subprocess.Popen(launcher(2, tmp_path, "--stop-signals", "none"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(tmp_path / "ready", first)
        os.kill(rank_pids(tmp_path)[1], signal.SIGUSR1)
        output, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode != 0, output
    assert "asked the job to stop" not in output
