"""The commit a benchmark measures, for the `commit` column of every result file; no MPI, so
that drivers which start jobs of their own (compare_commits.py) read it as the ranks do."""

import os
import subprocess

__all__ = ["measured_commit"]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")


def measured_commit(repository=REPOSITORY):
    """The commit checked out in `repository`, as `git rev-parse --short HEAD`, with "+dirty"
    appended when tracked files differ from it; "unknown" outside a git checkout (or without git).

    Changes under benchmarks/results/ do not count: a run of several benchmarks rewrites those
    files one after the other, and the code each of them measures is the same."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=repository, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      f":(exclude){os.path.relpath(RESULTS, REPOSITORY)}")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if changed.strip() else "")
