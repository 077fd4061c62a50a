"""A job that Slurm's `srun` launched directly: each task is a rank, with no mpirun.

`srun --mpi=pmix python train.py` hands every task the PMIx server of its node, through
which MPI_Init forms one job of all the step's tasks: rank = SLURM_PROCID, size =
SLURM_STEP_NUM_TASKS. Without a PMI plugin (`--mpi=none`, or Slurm built without PMIx), each
task's MPI_Init would quietly make a job of one rank, and N copies of the training would run
side by side. `init()` refuses that, before MPI starts, with what to install or pass.
"""

import dataclasses
from typing import Mapping, Optional

__all__ = ["SlurmLaunchError", "SlurmStep", "check_after_mpi_init", "check_before_mpi_init", "direct_step"]

# Variables a PMI server gives each task: PMIx (srun --mpi=pmix, Open MPI and MPICH) and PMI-2
# (srun --mpi=pmi2, MPICH).
_PMI_VARIABLES = ("PMIX_RANK", "PMI_RANK", "PMI_FD")
# Variables an MPI launcher's daemons give the ranks they start: a job step of those daemons
# (mpirun inside an allocation starts them with srun) is not a direct launch.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")


class SlurmLaunchError(RuntimeError):
    """srun started the tasks in a way that cannot form one MPI job."""


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """This task's place in the srun step that launched it."""

    job_id: str
    step_id: str
    task: int
    tasks: int

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.step_id}"


def direct_step(environ: Mapping[str, str]) -> Optional[SlurmStep]:
    """The srun step this process is a task of, when srun launched it as a rank itself (not
    through mpirun's daemons) in a step of more than one task; else None."""
    step_id, tasks = environ.get("SLURM_STEP_ID"), environ.get("SLURM_STEP_NUM_TASKS")
    if step_id is None or not (tasks or "").isdigit() or int(tasks) < 2:
        return None
    if any(name in environ for name in _LAUNCHER_VARIABLES):
        return None
    return SlurmStep(environ.get("SLURM_JOB_ID", "?"), step_id, int(environ.get("SLURM_PROCID", "0")), int(tasks))


def check_before_mpi_init(environ: Mapping[str, str]) -> Optional[SlurmStep]:
    """SlurmLaunchError where srun launched this task without a PMI server (MPI would make a
    job of one rank per task); the step otherwise (None when not launched by srun)."""
    step = direct_step(environ)
    if step is None or any(name in environ for name in _PMI_VARIABLES):
        return step
    raise SlurmLaunchError(
        f"hvdplus.init(): this process is task {step.task} of {step.tasks} of Slurm step {step.name}, but srun "
        "started it without a PMI server, so MPI would make a job of one rank on every task. Launch with "
        "`srun --mpi=pmix ...` (see `srun --mpi=list`); Slurm's PMIx plugin needs libpmix.so on every node "
        "(Debian and Ubuntu: apt-get install libpmix2 libpmix-dev), or set MpiDefault=pmix in slurm.conf. "
        "Or run `hvdplusrun python ...` in the allocation, which needs no plugin.")


def check_after_mpi_init(step: Optional[SlurmStep], rank: int, size: int) -> None:
    """SlurmLaunchError when MPI formed another job than srun's step (a PMI plugin that does
    not match this MPI)."""
    if step is None or (rank == step.task and size == step.tasks):
        return
    raise SlurmLaunchError(
        f"hvdplus.init(): Slurm step {step.name} has {step.tasks} tasks and this is task {step.task}, but MPI "
        f"made it rank {rank} of {size}: srun's --mpi plugin does not match this MPI. Open MPI from pip "
        "needs `srun --mpi=pmix`.")
