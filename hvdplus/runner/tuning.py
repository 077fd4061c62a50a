"""Launcher flags that tune the ranks, each passed on as one environment variable.

The ranks read these variables (see `hvdplus.common.settings`), so a job started with
plain `mpirun` and the variables exported behaves the same as one started by `hvdplusrun`.
"""

import argparse
import dataclasses
import os
from typing import Any, Callable, Dict, Mapping

from ..common.settings import ALLREDUCE_ALGORITHMS, env_names

__all__ = ["TuningFlag", "TUNING_FLAGS", "add_tuning_arguments", "tuning_environment"]

MIB = 1024 * 1024


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
    return int(text)


def _number(value: float) -> str:
    return format(value, "g")


@dataclasses.dataclass(frozen=True)
class TuningFlag:
    """One flag: its spelling, the setting it sets, how its value is written for the ranks,
    and its argparse options."""

    flag: str
    setting: str
    to_env: Callable[[Any], str]
    options: Mapping[str, Any]

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env_name(self) -> str:
        return env_names(self.setting)[0]


TUNING_FLAGS = (
    TuningFlag(
        "--fusion-threshold-mb", "FUSION_THRESHOLD", lambda mb: str(int(mb * MIB)),
        dict(type=_non_negative, metavar="MB", help="fuse tensors into buffers of up to MB MiB"),
    ),
    TuningFlag(
        "--cycle-time-ms", "CYCLE_TIME", _number,
        dict(type=_non_negative, metavar="MS", help="milliseconds between negotiation cycles"),
    ),
    TuningFlag(
        "--cache-capacity", "CACHE_CAPACITY", str,
        dict(type=_count, metavar="N", help="collectives whose negotiation is cached (0: none)"),
    ),
    TuningFlag(
        "--timeline-filename", "TIMELINE", os.path.abspath,
        dict(metavar="PATH", help="write a Chrome-trace timeline of collectives to PATH"),
    ),
    TuningFlag(
        "--hierarchical-allreduce", "HIERARCHICAL_ALLREDUCE", lambda _: "1",
        dict(action="store_true", default=None, help="reduce within each node, then across nodes"),
    ),
    TuningFlag(
        "--allreduce-algo", "ALLREDUCE_ALGO", str,
        dict(choices=ALLREDUCE_ALGORITHMS, help="allreduce algorithm (default: auto)"),
    ),
    TuningFlag(
        "--autotune", "AUTOTUNE", lambda _: "1",
        dict(action="store_true", default=None,
             help="tune fusion threshold, cycle time and (across nodes) algorithm while training"),
    ),
    TuningFlag(
        "--autotune-log-file", "AUTOTUNE_LOG", os.path.abspath,
        dict(metavar="PATH", help="write the autotuner's samples and choice to PATH as CSV"),
    ),
    TuningFlag(
        "--stall-check-time-seconds", "STALL_CHECK_TIME_SECONDS", _number,
        dict(type=_non_negative, metavar="S", help="warn when ranks wait for each other this long"),
    ),
    TuningFlag(
        "--stall-shutdown-time-seconds", "STALL_SHUTDOWN_TIME_SECONDS", _number,
        dict(type=_non_negative, metavar="S", help="abort after a stall this long (0: never)"),
    ),
)


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tuning (passed to every rank as HVDPLUS_* variables)")
    for tuning in TUNING_FLAGS:
        group.add_argument(tuning.flag, dest=tuning.dest, **tuning.options)


def tuning_environment(args: argparse.Namespace) -> Dict[str, str]:
    """The variables for the tuning flags given on the command line; unset flags add none."""
    return {
        tuning.env_name: tuning.to_env(value)
        for tuning in TUNING_FLAGS
        if (value := getattr(args, tuning.dest)) is not None
    }
