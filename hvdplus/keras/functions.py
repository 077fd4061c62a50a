"""Broadcasting Keras variables from one rank, on every backend: the step that
BroadcastGlobalVariablesCallback and the elastic KerasState's sync share."""

import re

import keras
import numpy as np

from ..core import collectives
from ..core.process_sets import require_member

__all__ = ["broadcast_variables"]


def broadcast_variables(variables, root_rank=0, prefix="variable", process_set=None):
    """Overwrite the Keras variables of every rank (of `process_set`) with `root_rank`'s values.

    Variables are named by their path, so ranks whose models differ (another layer, another
    shape) get a TensorMismatchError naming the variable on every rank, never a hang."""
    require_member(process_set, "broadcast_variables()")  # a rank outside the set: its ValueError first
    handles = []
    for index, variable in enumerate(variables):
        name = f"{prefix}.{index}.{_stable_path(variable)}"
        value = np.array(keras.ops.convert_to_numpy(variable), order="C")  # keeps 0-d shapes
        handles.append((variable, collectives.broadcast_async(value, root_rank, name, process_set)))
    for variable, handle in handles:
        variable.assign(handle.wait())


def _stable_path(variable) -> str:
    """The variable's path without Keras' per-process counters ('sequential_3/dense_7/kernel'
    becomes 'sequential/dense/kernel'): ranks that built other models first still agree."""
    path = getattr(variable, "path", "") or getattr(variable, "name", "")
    return "/".join(re.sub(r"_\d+$", "", part) for part in path.split("/"))
