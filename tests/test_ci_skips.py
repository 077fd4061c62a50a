"""With CI=true a skipped test fails the run (tests/conftest.py); elsewhere it is reported
with its reason."""

import os
import subprocess
import sys

from testkit.mpi_jobs import REPO


def run_suite(ci):
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/jobs/skips_once.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_a_skip_fails_the_run_in_ci():
    result = run_suite(ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "skipped with CI=true, which fails the run" in result.stdout, result.stdout
    assert "tests/jobs/skips_once.py::test_skips" in result.stdout, result.stdout


def test_a_skip_is_reported_with_its_reason_elsewhere():
    result = run_suite(ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED [1] tests/jobs/skips_once.py:12: what this test needs is missing" in result.stdout, result.stdout
