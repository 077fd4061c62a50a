"""`pytest FILE --ranks N` and the mpi_job fixture report each in-rank failure by file, test,
rank and assertion, and nothing else (tests/testkit/rank_reports.py)."""

import os
import re
import subprocess
import sys

import pytest

from testkit.mpi_jobs import REPO

pytestmark = pytest.mark.mpi

SUITE = "tests/jobs/in_rank_failures.py"


def rerun_on_ranks(nranks, env=None):
    # An option with its value apart, which the ranks' pytest must receive as a pair.
    return subprocess.run([sys.executable, "-m", "pytest", SUITE, "--ranks", str(nranks), "-p", "no:cacheprovider"],
                          cwd=REPO, env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=150)


def failed_lines(output):
    return [line for line in output.splitlines() if line.startswith("FAILED ")]


@pytest.mark.timeout(180)
def test_a_failure_on_one_rank_is_named_with_its_rank_and_the_rest_runs():
    result = rerun_on_ranks(3)
    assert result.returncode == 1, result.stdout + result.stderr
    assert failed_lines(result.stdout) == [
        f"FAILED {SUITE}::test_the_last_rank_fails_after_its_collective on rank 2: "
        "AssertionError: the last rank's check, with 3"], result.stdout
    # Every other test ran and passed on every rank: 4 tests x 3 ranks, less the failure.
    assert re.search(r"exit 1, 11 passed, 1 failed, 0 skipped", result.stdout), result.stdout
    assert "ended during" not in result.stdout, result.stdout
    # Each rank's whole pytest output is in its own file: the failure's traceback is in rank 2's.
    logs = re.search(r"^each rank's output: (.*)$", result.stdout, re.M).group(1).split(", ")
    assert [os.path.basename(log) for log in logs] == ["rank-0.log", "rank-1.log", "rank-2.log"]
    with open(logs[2]) as log:
        assert "AssertionError: the last rank's check" in log.read()
    with open(logs[0]) as log:
        assert re.search(r"^4 passed", log.read(), re.M)  # rank 0 failed nothing


@pytest.mark.timeout(180)
def test_a_rank_that_left_its_peers_in_a_collective_ends_the_job():
    result = rerun_on_ranks(2, env={"SKIP_A_COLLECTIVE": "1", "HVDPLUS_TEST_PEER_WAIT": "3"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert failed_lines(result.stdout) == [
        f"FAILED {SUITE}::test_the_last_rank_fails_after_its_collective on rank 1: "
        "AssertionError: the last rank's check, with 2",
        f"FAILED {SUITE}::test_the_last_rank_fails_before_a_collective on rank 1: "
        "AssertionError: the last rank leaves before the collective"], result.stdout
    assert (f"rank 1 ended during {SUITE}::test_the_last_rank_fails_before_a_collective without finishing "
            "its run: its peers did not finish this test within 3.0 s") in result.stdout, result.stdout
    assert f"rank 0 ended during {SUITE}::test_the_last_rank_fails_before_a_collective" in result.stdout
