"""Behaves as an mpirun that exits before a process it started: starts a copy of itself
(--sleep) that sleeps a minute, writes that copy's process id to PID_FILE and exits 0.

    leave_a_child_running.py PID_FILE

tests/test_runner.py checks that the supervisor, asked to end leftovers, ends the copy.
"""

import subprocess
import sys
import time

if sys.argv[1] == "--sleep":
    time.sleep(60)
else:
    child = subprocess.Popen([sys.executable, __file__, "--sleep"])
    with open(sys.argv[1], "w") as pid_file:
        pid_file.write(str(child.pid))
