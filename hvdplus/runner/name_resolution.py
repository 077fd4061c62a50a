"""Waiting for the job's host names to resolve before mpirun starts daemons on them.

On Kubernetes a pod's name enters the cluster's DNS a moment after the pod starts, and a
launcher that starts first sees its workers' names fail: mpirun then gives up at once, with
a message about ssh or a daemon that never called back. hvdplusrun instead looks every other
host's name up until all resolve, and only then starts mpirun; when some still do not after
the timeout, it stops with their names. The same holds on any cluster whose names appear late.

    wait_for_host_names(["worker-0.job", "worker-1.job"], timeout=60)
"""

import argparse
import os
import socket
import time
from typing import Callable, List, Mapping, Optional, Sequence

from .errors import LaunchError
from .hosts import Host, on_this_machine
from .launch_agent import CHANNEL_ENV

__all__ = ["TIMEOUT_ENV", "DEFAULT_TIMEOUT_S", "add_arguments", "timeout_from", "unresolved", "wait_for_host_names",
           "wait_for_job_hosts"]

TIMEOUT_ENV = "HVDPLUS_HOST_RESOLUTION_TIMEOUT"
# In a Kubernetes pod (KUBERNETES_SERVICE_HOST), new pods' names take a while to appear. Elsewhere
# a name that does not resolve is most likely mistyped: it is named after a short wait.
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_TIMEOUT_OUTSIDE_KUBERNETES_S = 10.0
_POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """hvdplusrun's --host-resolution-timeout."""
    parser.add_argument("--host-resolution-timeout", type=float, metavar="SECONDS",
                        help="how long to wait for the other hosts' names to resolve before starting the job "
                             f"(default: ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT_S:g} in a Kubernetes pod and "
                             f"{DEFAULT_TIMEOUT_OUTSIDE_KUBERNETES_S:g} elsewhere)")


def timeout_from(args: argparse.Namespace) -> float:
    """The timeout the flag gives, else the variable, else the default (longer in a Kubernetes pod)."""
    flag = getattr(args, "host_resolution_timeout", None)
    if flag is not None:
        return flag
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT_S if os.environ.get("KUBERNETES_SERVICE_HOST") else DEFAULT_TIMEOUT_OUTSIDE_KUBERNETES_S
    try:
        return float(text)
    except ValueError:
        raise LaunchError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds") from None


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def unresolved(names: Sequence[str], resolves: Callable[[str], bool] = _resolves) -> List[str]:
    """The names of `names` that do not resolve now, in order, each once."""
    return [name for name in dict.fromkeys(names) if not resolves(name)]


def wait_for_host_names(names: Sequence[str], timeout: float, resolves: Optional[Callable[[str], bool]] = None,
                        poll_s: float = _POLL_S) -> None:
    """Return once every name of `names` resolves; LaunchError naming those that still do not
    after `timeout` seconds.

    Args:
        names: the host names to look up (this machine's own are best left out).
        timeout: seconds to keep looking; 0 looks once.
        resolves: whether a name resolves now (by default, a look-up through the system's resolver).
        poll_s: seconds between two rounds of look-ups.
    """
    resolves = resolves or _resolves
    deadline = time.monotonic() + timeout
    missing = unresolved(names, resolves)
    while missing:
        if time.monotonic() >= deadline:
            raise LaunchError(f"these hosts' names did not resolve within {timeout:g} s: {', '.join(missing)} "
                              f"(--host-resolution-timeout or {TIMEOUT_ENV} waits longer)")
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        missing = unresolved(missing, resolves)


def wait_for_job_hosts(args: argparse.Namespace, hosts: Sequence[Host], env: Mapping[str, str]) -> None:
    """hvdplusrun's wait before one mpirun: for the names of `hosts` that are not this machine,
    unless the daemons start through the pipes of an AgentChannel (`env` names one), whose
    "hosts" are processes that Ray or Spark started, not names to look up.

    Args:
        args: hvdplusrun's flags (--host-resolution-timeout).
        hosts: the job's hosts.
        env: the environment mpirun gets.
    """
    if CHANNEL_ENV in env:
        return
    wait_for_host_names([host.name for host in hosts if not on_this_machine([host])], timeout_from(args))
