"""`hvdplusrun --check-build`: what this installation can run, found without starting MPI.

Frameworks are looked up, never imported (importing TensorFlow takes seconds), and the
MPI library is asked for its version with MPI left uninitialized.
"""

import dataclasses
import importlib.metadata
import importlib.util
import os
from typing import List, Optional, Sequence

from ..version import __version__
from .errors import LaunchError
from .mpi_discovery import MPIRUN_ENV, default_search_dirs, find_mpirun, identify_mpi
from .slurm_allocation import find_allocation

__all__ = ["Framework", "FRAMEWORKS", "build_report"]


@dataclasses.dataclass(frozen=True)
class Framework:
    """A framework hvdplus has an adapter for.

    Args:
        label: the name shown.
        module: its import name.
        distributions: the package names it is installed under, any one of which counts.
        adapter: hvdplus' subpackage for it.
    """

    label: str
    module: str
    distributions: Sequence[str]
    adapter: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def version(self) -> Optional[str]:
        for distribution in self.distributions:
            try:
                return importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def has_adapter(self) -> bool:
        return importlib.util.find_spec(self.adapter) is not None

    def report_line(self) -> str:
        installed, adapter = self.installed(), self.has_adapter()
        mark = "X" if installed and adapter else " "
        name = f"{self.label} {self.version() or ''}".rstrip()
        if not installed:
            status = "not installed"
        elif not adapter:
            status = f"installed, but {self.adapter} is missing"
        else:
            status = f"through {self.adapter}"
        return f"    [{mark}] {name}: {status}"


FRAMEWORKS = (
    Framework("PyTorch", "torch", ("torch",), "hvdplus.torch"),
    Framework(
        "TensorFlow", "tensorflow",
        ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos", "tf-nightly"),
        "hvdplus.tensorflow",
    ),
    Framework("Keras", "keras", ("keras",), "hvdplus.keras"),
)


def _mpi_library_lines() -> List[str]:
    try:
        import mpi4py
    except ImportError:
        return ["    [ ] mpi4py: not installed (pip install mpi4py)"]
    # Asking for the library version is allowed before MPI_Init; the launcher must not
    # initialize MPI, or it would become a one-process MPI job of its own.
    mpi4py.rc.initialize = False
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0]
    standard = "%d.%d" % MPI.Get_version()
    return [f"    [X] mpi4py {mpi4py.__version__}", f"        {library} (MPI {standard})"]


def _mpirun_lines() -> List[str]:
    try:
        mpirun = find_mpirun(default_search_dirs(), os.environ.get(MPIRUN_ENV))
        implementation = identify_mpi(mpirun)
    except LaunchError as error:
        return ["    [ ] mpirun: " + str(error).replace("\n", "\n        ")]
    return [f"    [X] mpirun: {mpirun} ({implementation.describe()})"]


def _scheduler_lines() -> List[str]:
    """Whether the launcher runs inside a Slurm allocation, and what it takes from it."""
    try:
        allocation = find_allocation(os.environ)
    except LaunchError as error:
        return [f"    [ ] Slurm: {error}"]
    if allocation is None:
        return ["    [ ] Slurm: not inside an allocation (no SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE)"]
    return [f"    [X] {allocation.describe()}",
            "        hvdplusrun takes these hosts and slots when no -np, -H or --hostfile is given; "
            "mpirun starts its daemons through srun"]


def build_report() -> str:
    lines = [f"hvdplus {__version__}", "", "MPI:"]
    lines += _mpi_library_lines() + _mpirun_lines()
    lines += ["", "Frameworks:"] + [framework.report_line() for framework in FRAMEWORKS]
    lines += ["", "Scheduler:"] + _scheduler_lines()
    return "\n".join(lines)
