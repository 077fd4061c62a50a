"""Prints 'ENV ' and a JSON object of this rank's environment variables whose names start with
any of the prefixes given as arguments; mpi4py alone (no hvdplus). tests/test_runner.py checks
that hvdplusrun's tuning flags and thread counts reach every rank."""

import json
import os
import sys

from mpi4py import MPI  # noqa: F401 (a rank that starts MPI, as a training script's ranks do)

chosen = {name: value for name, value in os.environ.items() if name.startswith(tuple(sys.argv[1:]))}
print("ENV " + json.dumps(chosen), flush=True)
