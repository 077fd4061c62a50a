"""What Slurm says of a job: the Key=Value fields of `scontrol show job -o`. The launcher's
elastic discovery reads from them the nodes a job still holds (runner/slurm_allocation), and
the ranks whether another host already asked for a requeue (elastic/slurm_requeue)."""

import re
import subprocess
from typing import Dict

__all__ = ["SCONTROL_TIMEOUT_S", "job_fields", "parse_fields"]

SCONTROL_TIMEOUT_S = 30


def job_fields(job_id: str, check: bool = False, scontrol: str = "scontrol") -> Dict[str, str]:
    """The fields of job `job_id` (JobState, NodeList, Restarts...); {} when scontrol prints
    none. With `check`, subprocess.CalledProcessError when scontrol fails; OSError and
    subprocess.TimeoutExpired as subprocess.run raises them."""
    shown = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True, text=True, check=check,
                           timeout=SCONTROL_TIMEOUT_S).stdout
    return parse_fields(shown)


def parse_fields(shown: str) -> Dict[str, str]:
    """`scontrol show -o` output as its Key=Value fields (values without spaces)."""
    return dict(re.findall(r"(\S+?)=(\S*)", shown))
