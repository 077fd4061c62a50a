"""Launcher flags that tune the ranks, each passed on as one environment variable.

The flags are those of the settings declared in `hvdplus.common.settings.SETTINGS` with
argparse options; the ranks read the variables back into their `Settings`, so a job started
with plain `mpirun` and the variables exported behaves the same as one started by `hvdplusrun`.
"""

import argparse
from typing import Dict

from ..common.settings import SETTINGS

__all__ = ["TUNING_SETTINGS", "add_tuning_arguments", "add_tuning_alias", "tuning_environment"]

# The launcher's own flags that set a variable (the elastic ones) are declared with no options.
TUNING_SETTINGS = tuple(setting for setting in SETTINGS if setting.flag is not None and setting.flag.options)


def _dest(setting) -> str:
    return setting.flag.spelling.lstrip("-").replace("-", "_")


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tuning (passed to every rank as HVDPLUS_* variables)")
    for setting in TUNING_SETTINGS:
        group.add_argument(setting.flag.spelling, dest=_dest(setting), **setting.flag.options)


def add_tuning_alias(group, spelling: str, field: str, help: str) -> None:
    """Another spelling (Horovod's) of the tuning flag of the setting `field`: the same value,
    passed on as the same variable.

    Args:
        group: the parser or argument group to add it to.
        spelling: the flag, e.g. "--stall-check-warning-time-seconds".
        field: the setting's attribute of `Settings`.
        help: its line in --help.
    """
    (setting,) = (setting for setting in TUNING_SETTINGS if setting.field == field)
    # SUPPRESS: an alias left out must not reset the value its setting's own flag gave.
    options = dict(setting.flag.options, help=help, default=argparse.SUPPRESS)
    group.add_argument(spelling, dest=_dest(setting), **options)


def tuning_environment(args: argparse.Namespace) -> Dict[str, str]:
    """The variables for the tuning flags given on the command line; unset flags add none."""
    return {
        setting.names[0]: setting.flag.to_env(value)
        for setting in TUNING_SETTINGS
        if (value := getattr(args, _dest(setting))) is not None
    }
