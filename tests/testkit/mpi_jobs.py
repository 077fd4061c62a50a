"""Starting real MPI jobs from single-process tests, always with a timeout. Tests reach this
through the `mpi_job` fixture (tests/conftest.py)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from testkit import rank_reports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# hvdplusrun ends mpirun's session 3 s after a SIGTERM (runner.supervise's KILL_AFTER_SECONDS);
# a launcher that is still there this much later is killed outright.
_TEARDOWN_SECONDS = 20


def launch(nranks, args, env=None, timeout=240, launcher_args=(), python=sys.executable):
    """Run `args` on `nranks` ranks through hvdplusrun (run by `python`); return the
    CompletedProcess.

    A job that outlives `timeout` is ended and reported as a failure, never waited on
    (see run_ending_on_timeout).
    """
    return run_ending_on_timeout(launcher_command(nranks, args, launcher_args, python),
                                 dict(os.environ, **(env or {})), timeout)


def launcher_command(nranks, args, launcher_args=(), python=sys.executable):
    """hvdplusrun's command line for `args` on `nranks` ranks, run by `python`."""
    return [python, "-m", "hvdplus.runner", "-np", str(nranks), *launcher_args, *args]


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


def start(nranks, args, env=None, launcher_args=(), python=sys.executable):
    """Start `args` on `nranks` ranks through hvdplusrun and return at once, with the RunningJob."""
    return RunningJob(launcher_command(nranks, args, launcher_args, python), dict(os.environ, **(env or {})))


class RunningJob:
    """hvdplusrun running in the background, its output gathered as it comes, for tests that
    signal the launcher at a moment they wait for. As a context manager it leaves no launcher
    running, and through it no rank (`end`)."""

    def __init__(self, command, env):
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self._lines = {"stdout": [], "stderr": []}
        self._stderr_at_signal = 0
        self._readers = [threading.Thread(target=self._read, args=(getattr(self.process, name), lines), daemon=True)
                         for name, lines in self._lines.items()]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.append(line)

    @property
    def stdout(self):
        return "".join(self._lines["stdout"])

    @property
    def stderr(self):
        return "".join(self._lines["stderr"])

    @property
    def stderr_since_signal(self):
        """What the launcher wrote to its standard error after `stop` signalled it."""
        return self.stderr[self._stderr_at_signal:]

    @property
    def returncode(self):
        return self.process.poll()

    def describe(self):
        """The launcher's status and the end of its output, for a failed assertion."""
        return f"exit {self.returncode}\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"

    def wait_for(self, text, timeout=60):
        """Wait until `text` appears in the output; fail the test if the launcher ends first or
        `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while text not in self.stdout + self.stderr:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{text!r} never appeared in the launcher's output: {self.describe()}")
            time.sleep(0.05)

    def stop(self, signum, timeout=30):
        """Send `signum` to the launcher; return the seconds it took to exit (fail past `timeout`)."""
        self._stderr_at_signal = len(self.stderr)
        sent = time.monotonic()
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher outlived {signal.Signals(signum).name} by {timeout} s: {self.describe()}")
        seconds = time.monotonic() - sent
        for reader in self._readers:
            reader.join(5)
        return seconds

    def end(self):
        """Stop a launcher that is still running as run_ending_on_timeout does."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(_TEARDOWN_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.end()


def run_pytest_on_ranks(nranks, paths, env=None, timeout=240, python=sys.executable, pytest_args=()):
    """Run pytest on `paths` in every rank with `python`; fail the calling test naming each
    failed test with its rank and assertion (testkit.rank_reports), else return the RankedRun."""
    run = rank_reports.run_suite_on_ranks(launch, nranks, paths, pytest_args, env=env, timeout=timeout,
                                          python=python)
    if not run.ok:
        pytest.fail(run.describe(), pytrace=False)
    return run


class MpiJob:
    """What the `mpi_job` fixture gives a test: calling it is `launch`; `start` serves tests
    that signal the launcher while the job runs; `run_pytest_on_ranks` and
    `run_ending_on_timeout` serve tests that run pytest in every rank or build the launcher's
    command line themselves."""

    __call__ = staticmethod(launch)
    start = staticmethod(start)
    run_pytest_on_ranks = staticmethod(run_pytest_on_ranks)
    run_ending_on_timeout = staticmethod(run_ending_on_timeout)
