"""Horovod's launcher flags that `horovodrun` takes beyond hvdplusrun's, and the import path
that lets ranks `import horovod.*` from hvdplus (see hvdplus.horovod_alias).

Flags with a meaning here become the variables Horovod's ranks read (HOROVOD_LOG_LEVEL, ...);
`--gloo` is refused, since every hvdplus job runs on MPI.
"""

import argparse
import os
from typing import Dict, Optional

from ..horovod_alias import PATH as ALIAS_PATH, real_horovod
from .tuning import add_tuning_alias

__all__ = ["add_arguments", "check", "environment", "python_path_with_alias"]

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Horovod's flags (horovodrun)")
    group.add_argument("--gloo", action="store_true", help="refused: hvdplus runs every job on MPI")
    group.add_argument("--mpi", action="store_true", help="accepted: hvdplus runs every job on MPI")
    group.add_argument("--tcp", action="store_true", help="accepted: MPI's TCP transport is used between hosts")
    group.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper, help="HOROVOD_LOG_LEVEL for the ranks")
    group.add_argument("--start-timeout", type=int, metavar="SECONDS", help="HOROVOD_START_TIMEOUT for the ranks")
    group.add_argument("--disable-cache", action="store_true", help="no response cache (--cache-capacity 0)")
    group.add_argument("--reset-limit", dest="max_restarts", type=int, default=argparse.SUPPRESS, metavar="N",
                       help="Horovod's name of --max-restarts")
    add_tuning_alias(group, "--stall-check-warning-time-seconds", "stall_check_seconds",
                     "Horovod's name of --stall-check-time-seconds")
    add_tuning_alias(group, "--stall-check-shutdown-time-seconds", "stall_shutdown_seconds",
                     "Horovod's name of --stall-shutdown-time-seconds")


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.gloo:
        parser.error("--gloo: hvdplus runs every job on MPI (Open MPI or MPICH); drop --gloo, or use --mpi")


def environment(args: argparse.Namespace) -> Dict[str, str]:
    """The ranks' variables for the Horovod flags given (none for hvdplusrun's own args)."""
    env = {}
    if getattr(args, "log_level", None):
        env["HOROVOD_LOG_LEVEL"] = args.log_level
    if getattr(args, "start_timeout", None) is not None:
        env["HOROVOD_START_TIMEOUT"] = str(args.start_timeout)
    if getattr(args, "disable_cache", False):
        env["HOROVOD_CACHE_CAPACITY"] = "0"
    return env


def python_path_with_alias(python_path: Optional[str]) -> str:
    """`python_path` with the Horovod alias first, unless a real Horovod is importable here
    (then it is left as it is: a real Horovod is never shadowed)."""
    parts = [part for part in (python_path or "").split(os.pathsep) if part]
    if real_horovod() is not None or ALIAS_PATH in parts:
        return os.pathsep.join(parts)
    return os.pathsep.join([ALIAS_PATH, *parts])
