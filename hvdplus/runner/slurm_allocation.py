"""The hosts and slots of the Slurm allocation the launcher runs in (`sbatch`, `salloc`).

Slurm writes them compressed: `SLURM_JOB_NODELIST=n[1-3,7],gpu[01-02]` names the hosts, and
`SLURM_TASKS_PER_NODE=2(x3),1` gives each host's tasks in the same order (2 on each of the
first three, 1 on the fourth). Inside an allocation, Open MPI's mpirun starts its daemons
through `srun`, never through ssh, so these hosts need no ssh between them.

    allocation = find_allocation(os.environ)  # None outside Slurm
    allocation.hosts                           # [Host("n1", 2), Host("n2", 2), ...]
"""

import dataclasses
import re
from typing import List, Mapping, Optional, Sequence

from ..common import slurm_jobs
from .errors import LaunchError
from .hosts import Host, format_host_list

__all__ = ["SlurmAllocation", "expand_host_list", "expand_tasks_per_node", "find_allocation", "fit_to_allocation"]

# A piece of a host list: text, then optionally one bracketed range list ("n", "[1-3,7]").
_PIECE = re.compile(r"([^\[\],]*)(?:\[([^\]]*)\])?")


@dataclasses.dataclass(frozen=True)
class SlurmAllocation:
    """The allocation: its job id, its hosts with their task slots, and the variables read."""

    job_id: str
    hosts: List[Host]
    node_list: str
    tasks_per_node: str

    def describe(self) -> str:
        """One line for --verbose and --check-build."""
        return (f"Slurm allocation of job {self.job_id}: {format_host_list(self.hosts)} "
                f"(SLURM_JOB_NODELIST={self.node_list}, SLURM_TASKS_PER_NODE={self.tasks_per_node})")


def _split_top_level(text: str) -> List[str]:
    """`text` cut at the commas outside brackets: "a[1,2],b" -> ["a[1,2]", "b"]."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_ranges(ranges: str, where: str) -> List[str]:
    """"1-3,07" -> ["1", "2", "3", "07"]; a range keeps its first number's zero padding."""
    numbers = []
    for item in ranges.split(","):
        first, _, last = item.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"{where}: '{item}' is not a number or a range of numbers")
        if not last:
            numbers.append(first)
            continue
        if int(last) < int(first):
            raise ValueError(f"{where}: the range '{item}' runs backwards")
        numbers += [str(number).zfill(len(first)) for number in range(int(first), int(last) + 1)]
    return numbers


def _expand_name(name: str, where: str) -> List[str]:
    """One host-list entry, with any number of bracketed parts: "r[1-2]n[1-2]" -> 4 names."""
    names = [""]
    position = 0
    while position < len(name):
        match = _PIECE.match(name, position)
        if not match or match.end() == position:
            raise ValueError(f"{where}: cannot read '{name}' (unbalanced brackets?)")
        text, ranges = match.groups()
        names = [prefix + text for prefix in names]
        if ranges is not None:
            names = [prefix + number for prefix in names for number in _expand_ranges(ranges, where)]
        position = match.end()
    return names


def expand_host_list(text: str) -> List[str]:
    """Slurm's compressed host list ("n[1-3,7],gpu[01-02],login") as names, in order."""
    where = f"host list '{text}'"
    return [host for entry in _split_top_level(text.strip()) for host in _expand_name(entry, where)]


def expand_tasks_per_node(text: str) -> List[int]:
    """Slurm's compressed counts per node ("2(x3),1") as one count per node: [2, 2, 2, 1]."""
    counts = []
    for item in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise ValueError(f"tasks per node '{text}': cannot read '{item}' (expected N or N(xM))")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def find_allocation(environ: Mapping[str, str]) -> Optional[SlurmAllocation]:
    """The Slurm allocation this process runs in, or None outside one (or when Slurm gave no
    task counts, as for `salloc` with neither -n nor --ntasks-per-node: one slot per CPU then)."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    node_list = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not node_list:
        return None
    tasks = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_JOB_CPUS_PER_NODE")
    if not tasks:
        return None
    try:
        names, counts = expand_host_list(node_list), expand_tasks_per_node(tasks)
    except ValueError as error:
        raise LaunchError(f"cannot read the Slurm allocation of job {job_id}: {error}") from None
    if len(names) != len(counts):
        raise LaunchError(f"the Slurm allocation of job {job_id} names {len(names)} hosts ({node_list}) but gives "
                          f"task counts for {len(counts)} ({tasks})")
    return SlurmAllocation(job_id, [Host(name, count) for name, count in zip(names, counts)], node_list, tasks)


def fit_to_allocation(allocation: SlurmAllocation, hosts: Sequence[Host], num_proc: Optional[int]) -> None:
    """LaunchError unless `hosts` (those -H or --hostfile named; none for all of them) and
    `num_proc` (-np) fit in `allocation`: Slurm would not start daemons on other hosts, and
    more ranks than slots would share cores that another job holds."""
    allocated = {host.name: host.slots for host in allocation.hosts}
    for host in hosts:
        if host.name not in allocated:
            raise LaunchError(f"-H/--hostfile names {host.name}, which is not in the Slurm allocation of job "
                              f"{allocation.job_id} ({format_host_list(allocation.hosts)})")
        if host.slots > allocated[host.name]:
            raise LaunchError(f"-H/--hostfile gives {host.name} {host.slots} slots, but the Slurm allocation of job "
                              f"{allocation.job_id} has {allocated[host.name]} tasks there")
    slots = sum(host.slots for host in hosts) if hosts else sum(allocated.values())
    if num_proc and num_proc > slots:
        raise LaunchError(f"-np {num_proc} is more than the {slots} slots of the Slurm allocation of job "
                          f"{allocation.job_id} ({format_host_list(hosts or allocation.hosts)}); ask sbatch/salloc "
                          "for more tasks (-n, --ntasks-per-node)")


class SlurmNodeDiscovery:
    """An elastic job's hosts inside an allocation: the nodes that Slurm still counts as the
    job's (`scontrol show job`, whose NodeList drops a node that failed under `sbatch
    --no-kill`), each with its slots from the allocation. The launcher's HostDiscovery for
    `--min-np` without a discovery script."""

    def __init__(self, allocation: SlurmAllocation, scontrol: str = "scontrol"):
        self.allocation = allocation
        self.scontrol = scontrol

    def hosts(self) -> List[Host]:
        import subprocess

        try:
            fields = slurm_jobs.job_fields(self.allocation.job_id, check=True, scontrol=self.scontrol)
        except (OSError, subprocess.SubprocessError) as error:
            raise LaunchError(f"{self.scontrol} show job -o {self.allocation.job_id} failed: {error}") from None
        node_list = fields.get("NodeList")
        if not node_list or node_list == "(null)":
            return []
        still = set(expand_host_list(node_list))
        return [host for host in self.allocation.hosts if host.name in still]
