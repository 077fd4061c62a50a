"""hvdplus on Apache Spark (pip `pyspark`): `run` starts the ranks of one MPI job inside the tasks
of one Spark barrier stage, and returns what each rank returned; `run_elastic` runs an elastic
job on tasks that may come and go.

Loaded on first use, so that `import hvdplus.spark` needs no Spark until `run` is called."""

import importlib

__all__ = ["run", "run_elastic"]

_MODULES = {"run": "hvdplus.spark.runner", "run_elastic": "hvdplus.spark.elastic"}


def __getattr__(name):
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'hvdplus.spark' has no attribute {name!r}")
