"""hvdplus on Apache Spark (pip `pyspark`): `run` starts the ranks of one MPI job inside the tasks
of one Spark barrier stage, and returns what each rank returned.

Loaded on first use, so that `import hvdplus.spark` needs no Spark until `run` is called."""

import importlib

__all__ = ["run"]


def __getattr__(name):
    if name == "run":
        return importlib.import_module("hvdplus.spark.runner").run
    raise AttributeError(f"module 'hvdplus.spark' has no attribute {name!r}")
