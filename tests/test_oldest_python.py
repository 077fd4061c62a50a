"""hvdplus on the oldest Python that setup.py accepts, in a virtual environment of its own.

hvdplus is installed there from this checkout as the README installs it; the environment
then passes the one-process tests of the core and runs the README's two-rank demo to the
same model as one process. It holds no framework: the README's framework pins need a newer
Python than hvdplus does (jax 0.10.2 needs 3.11, torch 2.13.0 and tensorflow-cpu 2.21.0 need
3.10), so it runs only the test files that import none.

That Python is `python3.X` on PATH, else pyenv's 3.X (tests/testkit/oldest_python.py). Without
it these tests fail in CI (`CI=true`) and skip elsewhere. The environment takes about 26 s of
a quiet core to build, once a run, in the background while other tests run.
"""

import os
import re
import subprocess

import pytest

from testkit import preparations
from testkit.mpi_jobs import REPO
from testkit.oldest_python import output_of, venv_environment

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
# The cases in those files that need a framework; deselected, so a skip means a new one.
FRAMEWORK_CASES = ["tests/test_runtime.py::test_horovods_build_queries_answer_before_init[hvdplus.torch]",
                   *(f"tests/test_runtime.py::test_gpu_available_answers_false_for_every_framework[hvdplus.{name}]"
                     for name in ("torch", "tensorflow", "keras"))]
DEMO = ["examples/numpy_logistic_regression.py"]


@pytest.fixture(scope="session")
def oldest_venv(run_folder):
    """The bin directory of a venv of the oldest supported Python with hvdplus installed editable,
    built in the background from the session's start (testkit/preparations.py)."""
    bin_dir, reason = preparations.result("oldest_venv", run_folder)
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI tests hvdplus on it", pytrace=False)
        pytest.skip(reason)
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
