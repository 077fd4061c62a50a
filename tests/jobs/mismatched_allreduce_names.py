"""Rank 0 all-reduces 'never_matched' while rank 1, 4 s later, all-reduces 'something_else', so
neither can ever complete. tests/test_engine_jobs.py runs it with a stall shutdown time: each
rank prints the StalledError it gets instead of hanging."""

import time

import numpy as np

import hvdplus as hvd

hvd.init()
try:
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(2), name="never_matched")
    else:
        time.sleep(4)
        hvd.allreduce(np.ones(2), name="something_else")
except hvd.StalledError as error:
    print(f"rank {hvd.rank()} StalledError:", str(error).splitlines()[0])
