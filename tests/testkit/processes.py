"""Whether the processes a job started are gone: by the process ids its ranks wrote as file
names into a folder (tests/jobs/mpi4py_sleeping_rank.py, steps_until_stopped.py)."""

import os
import signal
import time

__all__ = ["is_running", "pids_in", "assert_all_end", "kill_leftovers"]


def is_running(pid):
    """True while `pid` exists and is not a zombie awaiting its parent."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def pids_in(folder):
    """The process ids written as file names into `folder`."""
    return [int(name) for name in os.listdir(folder) if name.isdigit()]


def assert_all_end(pids, seconds=15):
    deadline = time.monotonic() + seconds
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(is_running, pids)), f"still running: {list(filter(is_running, pids))}"


def kill_leftovers(pids):
    """SIGKILL what is left of `pids`, so that a failed test leaves the cores to the next one."""
    for pid in filter(is_running, pids):
        os.kill(pid, signal.SIGKILL)
