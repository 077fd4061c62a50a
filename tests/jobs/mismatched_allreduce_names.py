"""Every rank but 1 all-reduces 'never_matched'; rank 1, half a second later, all-reduces
'something_else', or with --rank-1-idle submits nothing and sleeps. Neither all-reduce can
ever complete. tests/test_engine_jobs.py runs it with a stall shutdown time: each rank that
submitted prints the StalledError it gets instead of hanging, with the seconds it waited; with
--uncaught the error ends the program, and so the job, with a failure."""

import argparse
import sys
import time

import numpy as np

import hvdplus as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--rank-1-idle", action="store_true", help="rank 1 submits nothing and sleeps for minutes")
parser.add_argument("--uncaught", action="store_true", help="let the StalledError end the program")
arguments = parser.parse_args()

hvd.init()
if hvd.rank() == 1 and arguments.rank_1_idle:
    time.sleep(300)  # rank 0's StalledError ends the job long before
    sys.exit("rank 1 outlived the stall shutdown")
if hvd.rank() == 1:
    time.sleep(0.5)
name = "something_else" if hvd.rank() == 1 else "never_matched"
submitted = time.monotonic()
try:
    hvd.allreduce(np.ones(2), name=name)
except hvd.StalledError as error:
    if arguments.uncaught:
        raise
    print(f"rank {hvd.rank()} StalledError after {time.monotonic() - submitted:.1f} s: {error}")
