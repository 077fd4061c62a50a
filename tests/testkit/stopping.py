"""Jobs that tests stop with a signal to hvdplusrun: tests/jobs/steps_until_stopped.py brought to
the moment a test signals at, and what every such test checks (`assert_stops_at_once`)."""

import contextlib
import signal
import sys

from testkit import timing
from testkit.processes import assert_all_end, kill_leftovers, pids_in
from testkit.discovery import discovery_script
from testkit.programs import program

__all__ = ["STOP_SECONDS", "start_stepping", "start_committing", "start_waiting_to_restart", "assert_stops_at_once"]

# What a signal to hvdplusrun may take to end the job, ranks included: about 3.1 s on a quiet
# machine (the ranks' grace to stop before they are killed), so 8 keeps more than twice that.
STOP_SECONDS = 8


def start_stepping(mpi_job, folder, job_args=(), launcher_args=(), python=sys.executable, env=None):
    """Start 2 ranks of steps_until_stopped.py; return the RunningJob once they step."""
    job = mpi_job.start(2, program("steps_until_stopped", folder, *job_args, python=python),
                        env=env, launcher_args=launcher_args, python=python)
    with _ended_on_failure(job):
        job.wait_for("stepping on 2 ranks")
    return job


def start_committing(mpi_job, folder, launcher_args=("--min-np", "1"), python=sys.executable, env=None):
    """Start an elastic job of 2 ranks whose commits take 30 s; return the RunningJob once rank 0
    is inside its first commit."""
    job = start_stepping(mpi_job, folder, ["--elastic", "--commit-seconds", "30"], launcher_args, python, env)
    with _ended_on_failure(job):
        job.wait_for("inside commit")
    return job


def start_waiting_to_restart(mpi_job, folder, python=sys.executable, env=None):
    """Start an elastic job of 2 ranks that restarts (`--no-in-place`, `--min-np 2`); once they
    step, the discovery script shows one slot only and rank 1 dies. Return the RunningJob once
    the launcher has said it restarts: it then waits for a second slot, which never comes."""
    hosts, discovery = discovery_script(folder, 2)
    launcher_args = ["--min-np", "2", "--no-in-place", "--host-discovery-script", str(discovery)]
    job = start_stepping(mpi_job, folder, ["--elastic", "--die-when", folder / "die"], launcher_args, python, env)
    with _ended_on_failure(job):
        hosts.write_text("localhost:1\n")
        (folder / "die").touch()
        job.wait_for("restart 1 of at most")
    return job


@contextlib.contextmanager
def _ended_on_failure(job):
    """End `job` when the block fails: the caller never gets it to end."""
    try:
        yield
    except BaseException:
        job.end()
        raise


def assert_stops_at_once(job, signum, folder):
    """Send `signum` to the launcher of the RunningJob `job`; assert that it exits with 128+signum
    within STOP_SECONDS without starting the job again, and that none of the processes whose
    ids the ranks wrote into `folder` is left running. Returns the seconds it took."""
    try:
        seconds = job.stop(signum)
        assert job.returncode == 128 + signum, job.describe()
        timing.assert_took_under(seconds, STOP_SECONDS, quiet=3.1,
                                 what=f"the launcher ending the job on signal {signum}")
        assert "restart" not in job.stderr_since_signal, job.describe()
        assert_all_end(pids_in(folder), seconds=1)
    finally:
        kill_leftovers(pids_in(folder))
    print(f"{signal.Signals(signum).name}: the launcher exited {seconds:.2f} s after it")
    return seconds
