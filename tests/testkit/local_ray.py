"""A real local Ray for a test module, as a user's `ray.init()` makes one."""

import contextlib
import signal
from typing import Iterator

import ray

__all__ = ["local_ray"]


@contextlib.contextmanager
def local_ray() -> Iterator[None]:
    """Ray on this machine with two CPUs; after it, this process's SIGTERM handler is the one
    from before. `ray.init` puts in one that raises SystemExit, and in a pytest-xdist worker a
    SIGTERM between two tests would then end the worker's loop, and the run would hang on it."""
    previous = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous)
