"""Rank 1 joins an all-reduce named 'late_tensor' 3.5 s after the others and every rank prints
the result. tests/test_engine_jobs.py runs it with a 1 s stall check: the engine warns of the
stalled tensor, naming rank 1 as missing, and the all-reduce still completes."""

import time

import numpy as np

import hvdplus as hvd

hvd.init()
if hvd.rank() == 1:
    time.sleep(3.5)
print("result", hvd.allreduce(np.ones(2), name="late_tensor", op=hvd.Sum))
