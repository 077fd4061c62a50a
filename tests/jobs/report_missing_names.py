"""Imports MODULE as a program would and prints each of NAMES (dotted for attributes of
attributes) that it lacks, one a line.

    report_missing_names.py MODULE NAME...

tests/test_horovod_api_table.py runs it with the Horovod alias on the path, to check the docs'
tables of Horovod's names against the modules.
"""

import importlib
import sys

module = importlib.import_module(sys.argv[1])
for name in sys.argv[2:]:
    value = module
    for part in name.split("."):
        value = getattr(value, part, None)
    if value is None:
        print(name)
