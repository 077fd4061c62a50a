"""hvdplus on Ray: `RayExecutor` runs the ranks of one MPI job in Ray actors (pip `ray`).

Loaded on first use, so that the launch agent (`python -m hvdplus.ray.agent`) imports no Ray."""

import importlib

__all__ = ["RayExecutor"]


def __getattr__(name):
    if name == "RayExecutor":
        return importlib.import_module("hvdplus.ray.executor").RayExecutor
    raise AttributeError(f"module 'hvdplus.ray' has no attribute {name!r}")
