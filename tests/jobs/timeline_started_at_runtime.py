"""Three all-reduces, only the middle one between hvd.start_timeline(PATH, mark_cycles=True)
and hvd.stop_timeline(). tests/test_engine_jobs.py checks that the trace at PATH holds that one
tensor's row alone, and cycle marks."""

import sys

import numpy as np

import hvdplus as hvd

hvd.init()
hvd.allreduce(np.ones(2), name="before_start")
hvd.start_timeline(sys.argv[1], mark_cycles=True)
hvd.allreduce(np.ones(2), name="recorded")
hvd.stop_timeline()
hvd.allreduce(np.ones(2), name="after_stop")
