"""One rank leaves right after hvd.init(), with an exit code or an exception, while the others
go on: into an all-reduce it never joins ('waits_for_rank_<R>'), or, with --others-sleep, to
sleep; each of the others that gets through prints 'rank <r> finished its work'. The rank that
leaves prints 'rank <R> leaves at <time.time()>' first.

    one_rank_leaves_early.py --rank R (--exit CODE | --raise MESSAGE) [--others-sleep SECONDS]

tests/test_engine_jobs.py and tests/test_runtime.py check that a rank that exits or raises
fails the others' all-reduce instead of hanging them; tests/test_exit_guard.py that an exit
with an error ends the sleeping others within seconds of it, in each form of start, and that a
clean exit lets them finish.
"""

import argparse
import sys
import time

import numpy as np

import hvdplus as hvd

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--rank", type=int, required=True, help="the rank that leaves")
leaving = parser.add_mutually_exclusive_group(required=True)
leaving.add_argument("--exit", type=int, help="leave by sys.exit with this code")
leaving.add_argument("--raise", dest="message", help="leave by raising RuntimeError with this message")
parser.add_argument("--others-sleep", type=float, metavar="SECONDS",
                    help="the other ranks sleep this long instead of starting an all-reduce")
arguments = parser.parse_args()

hvd.init()
if hvd.rank() == arguments.rank:
    print(f"rank {hvd.rank()} leaves at {time.time():.3f}", flush=True)
    if arguments.message is not None:
        raise RuntimeError(arguments.message)
    sys.exit(arguments.exit)
if arguments.others_sleep is None:
    hvd.allreduce(np.ones(2), name=f"waits_for_rank_{arguments.rank}")
else:
    time.sleep(arguments.others_sleep)
print(f"rank {hvd.rank()} finished its work")
