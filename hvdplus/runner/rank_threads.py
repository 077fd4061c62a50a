"""How many compute threads each rank of a job on this machine gets, unless the user says.

Every rank's math library (OpenMP in torch, OpenBLAS or MKL under numpy) starts one thread
per core by default, so n ranks on one machine run n times as many threads as there are
cores. Their threads wait for each other by spinning: oversubscribed, a preempted thread
stalls its whole team, and any other thread that wakes (hvdplus' engine, a data loader)
preempts one, which can slow a rank several times over. With one thread per rank nothing
spins for a peer, and a rank's speed does not change when another thread wakes. torchrun
makes the same choice (OMP_NUM_THREADS=1 per process).
"""

import math
from typing import Dict, Mapping, Optional

__all__ = ["THREADS_VARIABLE", "cpu_quota", "usable_cores", "rank_threads_environment", "threads_note"]

THREADS_VARIABLE = "OMP_NUM_THREADS"
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def cpu_quota(path: str = CGROUP_CPU_MAX) -> Optional[int]:
    """The cores' worth of time this container may use (cgroup v2 `cpu.max`, as `docker
    --cpus` sets it), rounded up; None where there is no limit or no such file."""
    try:
        with open(path) as handle:
            quota, period = handle.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(math.ceil(int(quota) / int(period)), 1)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cores(visible: int) -> int:
    """The cores the ranks' threads may share: the `visible` ones, or fewer under a quota.
    (Open MPI's slots follow the visible cores; a container's quota only limits threads.)"""
    return min(visible, cpu_quota() or visible)


def rank_threads_environment(environ: Mapping[str, str], num_proc: int, local_only: bool,
                             core_count: int) -> Dict[str, str]:
    """{OMP_NUM_THREADS: cores // ranks} for a job whose ranks all run on this machine and
    whose user has not set it; else nothing (remote machines' cores are not known here)."""
    if THREADS_VARIABLE in environ or not local_only:
        return {}
    return {THREADS_VARIABLE: str(max(core_count // max(num_proc, 1), 1))}


def threads_note(setting: Mapping[str, str], num_proc: int, core_count: int) -> Optional[str]:
    """The note hvdplusrun prints when it chose the threads, or None."""
    if THREADS_VARIABLE not in setting:
        return None
    return (f"hvdplusrun: {THREADS_VARIABLE}={setting[THREADS_VARIABLE]} for each of {num_proc} ranks "
            f"on {core_count} cores; set {THREADS_VARIABLE} to choose otherwise")
