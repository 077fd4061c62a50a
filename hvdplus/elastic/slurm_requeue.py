"""Asking Slurm to requeue the job, from whichever rank is still alive.

After a stop (hvdplus.common.stop_requests) the ranks have written their commit; one rank
of each host then asks `scontrol requeue` in turn, a moment apart, each first looking whether
another did (the job's restart count went up, or it no longer runs, as after `scontrol
requeue`, whose SIGTERM stopped the ranks). So the job is
requeued whichever hosts are left, not only when rank 0's host is; a second ask never doubles
it. An array task is requeued as itself (`<array job>_<task>`). `SLURM_RESTART_COUNT` counts
the requeues so far: at HVDPLUS_MAX_REQUEUES the job ends instead.
"""

import subprocess
import time
from typing import Mapping, Optional

from ..common import slurm_jobs

__all__ = ["requeue_target", "request_requeue"]

_TURN_S = 1.0  # between hosts' turns


def requeue_target(environ: Mapping[str, str]) -> Optional[str]:
    """The job id `scontrol requeue` takes for this job (an array task's own), or None outside Slurm."""
    array_job, array_task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return environ.get("SLURM_JOB_ID") or None


def request_requeue(environ: Mapping[str, str], turn: int, max_requeues: int) -> str:
    """Ask Slurm to requeue this job, as the `turn`-th host (0 first); what happened, in words."""
    target = requeue_target(environ)
    if target is None:
        return "not in a Slurm job, so not requeued"
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    if restarts >= max_requeues:
        return (f"job {target} was not requeued: it has been requeued {restarts} times "
                f"(HVDPLUS_MAX_REQUEUES={max_requeues})")
    time.sleep(turn * _TURN_S)
    try:
        fields = slurm_jobs.job_fields(target)
        requeued = int(fields.get("Restarts") or fields.get("RestartCnt") or 0) > restarts
        if requeued or fields.get("JobState") not in ("RUNNING", None):
            return f"job {target} is already being requeued or ended (JobState={fields.get('JobState')})"
        done = subprocess.run(["scontrol", "requeue", target], capture_output=True, text=True,
                              timeout=slurm_jobs.SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        return f"could not ask Slurm to requeue job {target}: {error}"
    if done.returncode != 0:
        return f"scontrol requeue {target} failed: {(done.stderr or done.stdout).strip()}"
    return f"asked Slurm to requeue job {target} (requeue {restarts + 1} of at most {max_requeues})"
