"""Ranks that train in steps until they are stopped: each step computes a while (a short sleep)
and all-reduces a small array. After its first step, each rank writes an empty file named by its
process id into FOLDER, and rank 0 prints 'stepping on N ranks'. Each rank stops after two
minutes.

    steps_until_stopped.py FOLDER [--elastic] [--commit-seconds S] [--die-when FILE]

With --elastic the steps run inside hvdplus.elastic.run, with a commit every 10 steps, each of
which takes S seconds more with --commit-seconds (rank 0 prints 'inside commit' in the first). With
--die-when, rank 1 kills itself (SIGKILL) at its first step after FILE appears, once per job
(a file 'died' in FOLDER remembers it across restarts), so that an elastic job restarts or
re-forms.

tests/test_runner.py, tests/test_elastic.py and tests/test_mpich.py signal the launcher while
the ranks step, or while it waits to restart, and check that it ends the job at once with
128+N, without restarting it, and that none of those process ids is left running.
"""

import argparse
import os
import signal
import time

import numpy as np

import hvdplus as hvd

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("folder", help="where each rank writes a file named by its process id")
parser.add_argument("--elastic", action="store_true", help="step inside hvdplus.elastic.run")
parser.add_argument("--commit-seconds", type=float, default=0.0, help="how long each commit takes")
parser.add_argument("--die-when", metavar="FILE", help="rank 1 kills itself once FILE exists, once per job")
arguments = parser.parse_args()
DEADLINE = time.monotonic() + 120


def step():
    died = os.path.join(arguments.folder, "died")
    if arguments.die_when and hvd.rank() == 1 and os.path.exists(arguments.die_when) and not os.path.exists(died):
        open(died, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
    hvd.allreduce(np.ones(256), name="step")
    own_file = os.path.join(arguments.folder, str(os.getpid()))
    if not os.path.exists(own_file):
        open(own_file, "w").close()
        if hvd.rank() == 0:
            print(f"stepping on {hvd.size()} ranks", flush=True)


def plain():
    while time.monotonic() < DEADLINE:
        step()


@hvd.elastic.run
def elastic(state):
    while time.monotonic() < DEADLINE:
        step()
        state.step += 1
        if state.step % 10 == 0:
            state.commit()


def slow_commits(state):
    """Make each commit of `state` take --commit-seconds more, inside it."""
    save = state.save

    def slow_save():
        save()
        if state.step == 0:  # the save before the first step, no commit: the tests wait in one at step 10
            return
        if hvd.rank() == 0 and state.step == 10:
            print("inside commit", flush=True)
        time.sleep(arguments.commit_seconds)

    state.save = slow_save
    return state


hvd.init()
if arguments.elastic:
    elastic(slow_commits(hvd.elastic.ObjectState(step=0)))
else:
    plain()
