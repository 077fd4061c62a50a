"""Hosts a job may use: `-H host:slots,...` and hostfiles of `host slots=N` lines.

Open MPI reads these formats itself; MPICH's hydra wants `host:N`, so `hydra_hostfile_text`
rewrites a parsed hostfile for it. A host given without a slot count has one slot.
"""

import dataclasses
import socket
from typing import Iterable, List, Sequence

from .errors import LaunchError

__all__ = [
    "on_this_machine",
    "Host",
    "parse_host_list",
    "parse_hostfile",
    "read_hostfile",
    "format_host_list",
    "hydra_hostfile_text",
    "total_slots",
]


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine and how many ranks it takes."""

    name: str
    slots: int = 1


def _slot_count(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise LaunchError(f"{where}: slots must be a positive integer, got {text!r}")
    return int(text)


def parse_host_list(spec: str) -> List[Host]:
    """Parse the value of `-H/--hosts`, e.g. `node1:4,node2:4`.

    Args:
        spec: comma-separated `name[:slots]` entries.
    """
    hosts = []
    for entry in spec.split(","):
        entry = entry.strip()
        name, colon, slots = entry.rpartition(":")
        if not colon:
            name, slots = entry, "1"
        if not name:
            raise LaunchError(f"-H/--hosts entry {entry!r}: expected host or host:slots")
        hosts.append(Host(name, _slot_count(slots, f"-H/--hosts entry {entry!r}")))
    return hosts


def parse_hostfile(text: str, source: str = "hostfile") -> List[Host]:
    """Parse hostfile lines `name [slots=N] [key=value ...]`; `#` starts a comment.

    Keys other than `slots` (Open MPI's `max_slots`, for instance) are left to mpirun,
    which reads the original file.

    Args:
        text: the file's contents.
        source: the file's name, used in error messages.
    """
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source}, line {number}"
        slots = 1
        for field in fields[1:]:
            key, equals, value = field.partition("=")
            if not equals:
                raise LaunchError(f"{where}: expected 'host slots=N', got {line.strip()!r}")
            if key == "slots":
                slots = _slot_count(value, where)
        hosts.append(Host(fields[0], slots))
    if not hosts:
        raise LaunchError(f"{source} names no hosts")
    return hosts


def read_hostfile(path: str) -> List[Host]:
    """Read and parse the hostfile at `path`."""
    try:
        with open(path) as handle:
            return parse_hostfile(handle.read(), source=path)
    except OSError as error:
        raise LaunchError(f"cannot read --hostfile {path!r}: {error.strerror}") from None


def format_host_list(hosts: Iterable[Host]) -> str:
    """`node1:4,node2:4`: what both `mpirun -H` and hydra's `-hosts` accept."""
    return ",".join(f"{host.name}:{host.slots}" for host in hosts)


def hydra_hostfile_text(hosts: Iterable[Host]) -> str:
    """The hostfile for MPICH/Intel MPI's hydra (`-f`): one `host:N` per line."""
    return "".join(f"{host.name}:{host.slots}\n" for host in hosts)


def total_slots(hosts: Sequence[Host]) -> int:
    return sum(host.slots for host in hosts)


def on_this_machine(hosts: Sequence[Host]) -> bool:
    """Whether every rank runs here: no hosts given, or each one names this machine."""
    here = {"localhost", "127.0.0.1", socket.gethostname()}
    return all(host.name in here for host in hosts)
