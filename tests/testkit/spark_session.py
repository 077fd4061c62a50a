"""A local Spark session for the tests, whose tasks run this Python (with hvdplus and the
frameworks in it), with the UI and the progress bar off and only errors logged."""

import os
import sys

__all__ = ["local_session"]


def local_session(master: str, **config):
    """A session under `master` (`local[2]`, `local-cluster[2,1,1024]`), with `config` set."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (SparkSession.builder.master(master).appName("hvdplus-tests").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
