"""Imports each MODULE and prints one JSON object: MODULE -> the names in its `__all__` that
it has as attributes (asked for, so names loaded on first use load), or null where no module
of that name exists.

    report_exports.py MODULE...

tests/test_adapter_contract.py runs it with KERAS_BACKEND=tensorflow, to check the adapter
contract in docs/design.md against the adapters.
"""

import importlib
import json
import sys


def exports(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise  # a module it imports is missing: say that
        return None
    return [attribute for attribute in module.__all__ if hasattr(module, attribute)]


print(json.dumps({name: exports(name) for name in sys.argv[1:]}))
