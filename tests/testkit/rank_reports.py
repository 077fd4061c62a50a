"""Reports of in-rank test runs: every rank of an MPI job runs pytest on a tests/mpi suite,
writes its output and its failures to files of its own, and the test that started the job
reads them back and names each failure by test, rank and assertion.

Each rank runs pytest through testkit/rank_pytest.py, which sends its output to a file of
its own. The rank half (`RankReporter`) is registered in every rank by tests/conftest.py when
`--rank-report-dir` is given. After each test the ranks agree on who failed it, so a test
that failed on one rank is reported once, with its rank, and the ranks stay in step for
the next test. A rank whose failure made it skip a collective leaves its peers waiting in
that collective; it then stops the job rather than wait for them.

The launching half (`run_suite_on_ranks`, `summarize`) serves the `mpi_job` fixture and
`pytest ... --ranks N`.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Union

from testkit import rank_pytest
from testkit.rank_pytest import env_rank, rank_log

__all__ = ["RankReporter", "RankedRun", "run_suite_on_ranks", "summarize"]

# A rank that failed a test waits this long for its peers to finish the same test; peers
# that do not are waiting in a collective the failed rank skipped.
PEER_WAIT_SECONDS = float(os.environ.get("HVDPLUS_TEST_PEER_WAIT", "20"))


def _report_path(folder, rank, suffix):
    return os.path.join(folder, f"rank-{rank}.{suffix}")


class RankReporter:
    """The pytest plugin each rank runs: each test it starts, each failure and its closing
    counts go to rank-N.jsonl in `folder`."""

    def __init__(self, folder: str):
        self.rank = env_rank()
        self.folder = folder
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self._failed_here = False
        self._agreement_comm = None
        self._events = open(_report_path(folder, self.rank, "jsonl"), "w", buffering=1)
        # rank_pytest.py keeps the job's own stdout open for the closing line.
        job_stdout = os.environ.get("HVDPLUS_RANK_STDOUT_FD")
        self._job_stdout = os.fdopen(int(job_stdout), "w", buffering=1) if job_stdout else None

    def _write(self, **event):
        self._events.write(json.dumps(event) + "\n")

    def pytest_runtest_logstart(self, nodeid):
        self._failed_here = False
        self._write(event="started", nodeid=nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            if report.outcome in self.counts and not (report.when == "teardown" and report.outcome == "skipped"):
                self.counts[report.outcome] += 1
        if report.outcome == "failed":
            self._failed_here = True
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash else str(report.longrepr).strip().splitlines()[-1]
            where = f"{os.path.relpath(crash.path)}:{crash.lineno}" if crash else ""
            self._write(event="failed", nodeid=report.nodeid, when=report.when, message=message, where=where)

    def pytest_runtest_logfinish(self, nodeid):
        failed_ranks = self._agree_on_failures()
        if failed_ranks is None:
            self._write(event="stopped", nodeid=nodeid,
                        reason=f"its peers did not finish this test within {PEER_WAIT_SECONDS} s")
            self._close(exitstatus=1)
            os._exit(1)  # ends the job: the peers wait in a collective this rank left
        if failed_ranks:
            self._write(event="agreed", nodeid=nodeid, failed_ranks=failed_ranks)

    def _agree_on_failures(self) -> Optional[List[int]]:
        """The ranks that failed the test just run; None when this rank failed it and its
        peers did not finish it in time."""
        import numpy as np
        from mpi4py import MPI

        if self._agreement_comm is None:
            self._agreement_comm = MPI.COMM_WORLD.Dup()  # away from hvdplus' own traffic
        comm = self._agreement_comm
        flags = np.zeros(comm.Get_size(), np.int32)
        request = comm.Iallgather(np.array([int(self._failed_here)], np.int32), flags)
        deadline = time.monotonic() + PEER_WAIT_SECONDS
        pause = 0.0002
        while not request.Test():
            if self._failed_here and time.monotonic() > deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return [int(rank) for rank in np.flatnonzero(flags)]

    def _close(self, exitstatus):
        self._write(event="finished", exitstatus=int(exitstatus), **self.counts)
        self._events.close()
        summary = ", ".join(f"{count} {outcome}" for outcome, count in self.counts.items() if count)
        if self._job_stdout is not None:
            self._job_stdout.write(f"rank {self.rank}: {summary or 'no tests'}, exit {int(exitstatus)}; "
                                   f"output in {rank_log(self.folder, self.rank)}\n")
            self._job_stdout.close()

    def pytest_sessionfinish(self, session, exitstatus):
        self._close(exitstatus)


@dataclasses.dataclass
class RankedRun:
    """What the ranks of one in-rank pytest job reported."""

    nranks: int
    paths: List[str]
    folder: str
    returncode: Union[int, str]  # a string says why there is none
    failures: List[dict]  # each with nodeid, rank, when, message, where
    unfinished: List[dict]  # each with rank, the test it was in (or None) and why, if known
    counts: dict  # outcome -> total over the ranks
    launcher_says: str = ""  # the launcher's last words, when the ranks' reports do not explain its exit
    output: str = ""  # what the launcher printed: each rank's closing line, tagged with its rank


    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.failures and not self.unfinished and not self.launcher_says

    def rank_log(self, rank) -> str:
        return rank_log(self.folder, rank)

    def describe(self) -> str:
        """Each failure by test, rank and assertion; then the ranks that never finished."""
        lines = [f"{self.nranks}-rank pytest of {' '.join(self.paths)}: exit {self.returncode}, "
                 + ", ".join(f"{count} {outcome}" for outcome, count in self.counts.items())]
        for failure in self.failures:
            phase = "" if failure["when"] == "call" else f" (in {failure['when']})"
            lines.append(f"FAILED {failure['nodeid']} on rank {failure['rank']}{phase}: {failure['message']}"
                         + (f" [{failure['where']}]" if failure["where"] else ""))
        for rank in self.unfinished:
            inside = f"during {rank['nodeid']}" if rank["nodeid"] else "before its first test"
            lines.append(f"rank {rank['rank']} ended {inside} without finishing its run"
                         + (f": {rank['reason']}" if rank.get("reason") else ""))
        if self.launcher_says:
            lines.append("the launcher said:\n" + self.launcher_says)
        lines.append("each rank's output: " + ", ".join(self.rank_log(rank) for rank in range(self.nranks)))
        return "\n".join(lines)


def summarize(folder, nranks, paths, returncode) -> RankedRun:
    """Read the rank reports of a finished job in `folder`."""
    failures, unfinished = [], []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for rank in range(nranks):
        path = _report_path(folder, rank, "jsonl")
        events = []
        if os.path.exists(path):
            with open(path) as lines:
                events = [json.loads(line) for line in lines if line.strip()]
        failures += [dict(event, rank=rank) for event in events if event["event"] == "failed"]
        finished = [event for event in events if event["event"] == "finished"]
        for outcome in counts:
            counts[outcome] += sum(event[outcome] for event in finished)
        stopped = [event for event in events if event["event"] == "stopped"]
        if not finished or stopped:
            started = [event["nodeid"] for event in events if event["event"] == "started"]
            unfinished.append({"rank": rank, "nodeid": started[-1] if started else None,
                               "reason": stopped[0]["reason"] if stopped else None})
    return RankedRun(nranks, list(paths), folder, returncode, failures, unfinished, counts)


def run_suite_on_ranks(launch, nranks, paths, pytest_args=(), env=None, timeout=240,
                       python=sys.executable, keep_output=False) -> RankedRun:
    """Run pytest on `paths` in every rank of an `nranks` job started by `launch` (mpi_jobs'),
    each rank reporting into a fresh folder; the folder is removed when every rank passed,
    unless `keep_output`."""
    folder = tempfile.mkdtemp(prefix=f"hvdplus-{nranks}-ranks-")
    job_env = {"HVDPLUS_MPI_TESTS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    args = [python, rank_pytest.__file__, folder, "-q", "-p", "no:cacheprovider", "--color=no", "--timeout", "120",
            *pytest_args, *paths]
    try:
        result = launch(nranks, args, env=job_env, timeout=timeout, python=python)
        returncode, output = result.returncode, (result.stdout or "") + (result.stderr or "")
    except subprocess.TimeoutExpired as expired:
        returncode = f"none: ended at its {timeout} s timeout"
        output = (expired.output or "") + (expired.stderr or "")
    run = summarize(folder, nranks, paths, returncode)
    run.output = output
    if returncode != 0 and not run.failures:
        run.launcher_says = output[-6000:].strip() or "nothing"  # the reports alone do not explain the exit
    if run.ok and not keep_output:
        shutil.rmtree(folder, ignore_errors=True)
    return run
