"""Rank 1 joins an all-reduce named 'late_tensor' DELAY seconds after the others, and every
rank prints the result. tests/test_engine_jobs.py runs it with a 2 s stall check and a 5 s
delay: the engine warns of the stalled tensor at 2 s and at 4 s, no more often, naming rank 1
as missing and as having submitted nothing meanwhile, and the all-reduce still completes."""

import argparse
import time

import numpy as np

import hvdplus as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--delay", type=float, default=5.0, help="seconds rank 1 waits before it all-reduces")
arguments = parser.parse_args()

hvd.init()
if hvd.rank() == 1:
    time.sleep(arguments.delay)
print("result", hvd.allreduce(np.ones(2), name="late_tensor", op=hvd.Sum))
