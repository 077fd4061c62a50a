"""Twenty all-reduces submitted at once, then an all-gather, under the timeline that
HVDPLUS_TIMELINE names. tests/test_engine_jobs.py reads the trace for each phase, a row per
tensor (`allreduce.layer0`), fused float16 tensors and, where cycles are marked, CYCLE_START
events; with --exit-abruptly every rank leaves by os._exit, so the trace must be readable
without the end a normal shutdown writes."""

import argparse
import os

import numpy as np

import hvdplus as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--exit-abruptly", action="store_true", help="leave by os._exit, skipping shutdown")
arguments = parser.parse_args()

hvd.init()
# float16 goes through the fusion buffer; float64 is reduced where it lies.
handles = [hvd.allreduce_async(np.ones(10, dtype=np.float16 if i % 2 else np.float64), name=f"layer{i}")
           for i in range(20)]
for handle in handles:
    hvd.synchronize(handle)
hvd.allgather(np.ones((2, 2)), name="gathered")
if arguments.exit_abruptly:
    os._exit(0)
