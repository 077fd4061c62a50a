"""Stands in for mpirun's output: writes TEXT to stdout, then TEXT to stderr (in two writes,
split after --split characters, with a pause between, as a pipe may deliver it), then exits
with --exit.

    print_as_mpirun.py [--stdout TEXT] [--stderr TEXT] [--split N] [--exit CODE]

tests/test_runner.py runs it under the supervisor, which reads mpirun's messages about lost
hosts from both streams.
"""

import argparse
import sys
import time

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--stdout", default="", help="what to write to stdout")
parser.add_argument("--stderr", default="", help="what to write to stderr, after stdout")
parser.add_argument("--split", type=int, help="write stderr's text in two pieces, split here")
parser.add_argument("--exit", type=int, default=0, help="the exit status")
arguments = parser.parse_args()

sys.stdout.write(arguments.stdout)
sys.stdout.flush()
split = len(arguments.stderr) if arguments.split is None else arguments.split
sys.stderr.write(arguments.stderr[:split])
sys.stderr.flush()
if arguments.stderr[split:]:
    time.sleep(0.2)
    sys.stderr.write(arguments.stderr[split:])
sys.exit(arguments.exit)
