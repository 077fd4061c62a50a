"""hvdplus on Ray (pip `ray`): `RayExecutor` runs the ranks of one MPI job in Ray actors, and
`HvdplusConfig` is the Ray Train backend whose training workers are the ranks of one MPI job.

Loaded on first use, so that the placeholder rank (`python -m hvdplus.ray.placeholder`) imports
no Ray."""

import importlib

__all__ = ["RayExecutor", "HvdplusConfig"]


def __getattr__(name):
    if name == "RayExecutor":
        return importlib.import_module("hvdplus.ray.executor").RayExecutor
    if name == "HvdplusConfig":
        return importlib.import_module("hvdplus.ray.train_backend").HvdplusConfig
    raise AttributeError(f"module 'hvdplus.ray' has no attribute {name!r}")
