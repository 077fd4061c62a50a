"""One rank fails, by exiting with a code or raising RuntimeError, while the others wait in a
barrier; mpi4py alone (no hvdplus).

    mpi4py_one_rank_fails.py --rank R (--exit CODE | --raise MESSAGE)

tests/test_runner.py checks that hvdplusrun ends the job with the rank's exit code, or fails
it showing the rank's error, instead of leaving the others waiting.
"""

import argparse
import sys

from mpi4py import MPI

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--rank", type=int, required=True, help="the rank that fails")
failing = parser.add_mutually_exclusive_group(required=True)
failing.add_argument("--exit", type=int, help="fail by sys.exit with this code")
failing.add_argument("--raise", dest="message", help="fail by raising RuntimeError with this message")
arguments = parser.parse_args()

if MPI.COMM_WORLD.Get_rank() == arguments.rank:
    if arguments.message is not None:
        raise RuntimeError(arguments.message)
    sys.exit(arguments.exit)
MPI.COMM_WORLD.Barrier()
