"""Behaves as a stubborn mpirun: ignores SIGTERM, starts a copy of itself (--grandchild) in a
process group of its own that ignores SIGTERM too, writes that copy's process id to PID_FILE
and sleeps a minute.

    ignore_sigterm_with_grandchild.py PID_FILE

tests/test_runner.py checks that the supervisor's SIGKILL after its grace period ends both.
"""

import os
import signal
import subprocess
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] != "--grandchild":
    grandchild = subprocess.Popen([sys.executable, __file__, "--grandchild"], preexec_fn=os.setpgrp)
    with open(sys.argv[1], "w") as pid_file:
        pid_file.write(str(grandchild.pid))
time.sleep(60)
