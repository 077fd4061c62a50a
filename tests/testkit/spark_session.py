"""A local Spark session for the tests, whose tasks run this Python (with hvdplus and the
frameworks in it), with the UI and the progress bar off and only errors logged. The driver
listens on loopback, so the tests' traffic (Spark's own, and run_elastic's task board on the
driver's host) stays on this machine's loopback interface."""

import os
import sys

__all__ = ["local_session"]


def local_session(master: str, **config):
    """A session under `master` (`local[2]`, `local-cluster[2,1,1024]`), with `config` set."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # where Spark's JVMs (a local cluster's too) listen
    builder = (SparkSession.builder.master(master).appName("hvdplus-tests").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1"))
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
