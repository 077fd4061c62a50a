"""Rank 1 shuts hvdplus down with an all-reduce ('orphan') still pending, then waits on its
handle. tests/test_engine_jobs.py checks that the wait raises ShutdownError naming the
tensor, and that the job ends promptly."""

import numpy as np

import hvdplus as hvd

hvd.init()
if hvd.rank() == 1:
    handle = hvd.allreduce_async(np.ones(2), name="orphan")
    hvd.shutdown()
    try:
        hvd.synchronize(handle)
    except hvd.ShutdownError as error:
        print("rank 1 ShutdownError:", error)
else:
    hvd.shutdown()
print("rank", "done")
