"""Checks that every rank of a set holds the same few numbers (settings, the step it is at),
with one small all-gather: where they differ, every rank raises the same ValueError, naming
the numbers and the ranks, rather than going on to collectives that never pair up.

Periodic model averaging checks its settings when it is made and its step at each averaging:
a rank that averages at another step than the others fails there, on every rank, at once.
"""

from typing import Dict

import numpy as np

from ..common.averaging_schedule import differences
from .collectives import allgather
from .process_sets import ranks_in

__all__ = ["require_same"]


def require_same(values: Dict[str, int], name: str, what: str, process_set=None) -> None:
    """Raise ValueError on every rank of `process_set` unless each holds the same `values`.

    Args:
        values: integers by name, in the same order on every rank.
        name: the all-gather's name, the same on every rank.
        what: the caller, for the message ("LocalSGD").
        process_set: the ranks that compare (default: every rank).
    """
    row = np.array([[int(value) for value in values.values()]], dtype=np.int64)
    rows = allgather(row, name=name, process_set=process_set)
    message = differences(list(values), rows.tolist(), ranks_in(process_set, what))
    if message is not None:
        raise ValueError(f"{what}: the ranks differ in {message}; every rank must average at the same steps, "
                         "with the same settings")
