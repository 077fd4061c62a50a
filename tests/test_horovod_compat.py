"""The drop-in for Horovod: `horovodrun` and `import horovod.*` (hvdplus.horovod_alias).

Programs in Horovod's style (tests/horovod_programs/) run under horovodrun, each at 2 or 3 ranks,
and check themselves against single-process references; the alias is checked in fresh
interpreters, including that it refuses to shadow a Horovod installed beside it (a
stand-in package on the path, tests/jobs/installed_horovod)."""

import os
import subprocess
import sys

import pytest

from hvdplus.common.settings import Settings
from hvdplus.horovod_alias import PATH as ALIAS_PATH
from hvdplus.runner import horovod_flags
from hvdplus.runner.launch import parse_args
from hvdplus.runner.tuning import tuning_environment

from testkit.programs import FOLDER, program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "horovod_programs")
# A folder holding a package named horovod, with a launcher, as a real install has.
INSTALLED_HOROVOD = os.path.join(FOLDER, "installed_horovod")


def python(command, *path, timeout=120):
    """`command`, a fresh interpreter, with `path` first on its import path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def test_horovod_modules_are_hvdplus_modules():
    result = python(program("horovod_modules_are_hvdplus"), ALIAS_PATH)
    assert result.returncode == 0 and "aliased" in result.stdout, result.stderr[-3000:]


def test_a_module_hvdplus_does_not_serve_is_named():
    result = python([sys.executable, "-c", "import horovod.mxnet"], ALIAS_PATH)
    assert result.returncode != 0
    assert "No module named 'horovod.mxnet'" in result.stderr and "hvdplus serves" in result.stderr


def test_horovods_spark_and_ray_runners_are_hvdplus_ones():
    check = ("import horovod.spark, horovod.spark.keras, horovod.spark.torch, horovod.ray, hvdplus.spark, "
             "hvdplus.ray; import hvdplus.spark.keras as keras, hvdplus.spark.torch as torch; print("
             "horovod.spark.run is hvdplus.spark.run, horovod.spark.run_elastic is hvdplus.spark.run_elastic, "
             "horovod.spark.keras.KerasEstimator is keras.KerasEstimator, "
             "horovod.spark.torch.TorchEstimator is torch.TorchEstimator, "
             "horovod.ray.RayExecutor is hvdplus.ray.RayExecutor)")
    result = python([sys.executable, "-c", check], ALIAS_PATH)
    assert result.returncode == 0 and result.stdout.split() == ["True"] * 5, result.stderr[-3000:]


def test_the_alias_refuses_to_shadow_an_installed_horovod():
    result = python([sys.executable, "-c", "import horovod"], ALIAS_PATH, INSTALLED_HOROVOD)
    assert result.returncode != 0
    assert "will not shadow the Horovod installed at " + os.path.join(INSTALLED_HOROVOD, "horovod") in result.stderr


def test_the_launcher_leaves_the_alias_out_where_horovod_is_installed(monkeypatch):
    assert horovod_flags.python_path_with_alias("/x").split(os.pathsep) == [ALIAS_PATH, "/x"]
    monkeypatch.setattr(sys, "path", [INSTALLED_HOROVOD, *sys.path])
    assert horovod_flags.python_path_with_alias("/x") == "/x"


def test_horovodrun_hands_over_to_an_installed_horovod():
    env = dict(os.environ, PYTHONPATH=INSTALLED_HOROVOD)
    result = subprocess.run([sys.executable, "-m", "hvdplus.runner.horovodrun", "-np", "2", "python", "x.py"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "real horovodrun ['-np', '2', 'python', 'x.py']" in result.stdout


def test_horovodrun_refuses_gloo_naming_what_to_use():
    result = subprocess.run([sys.executable, "-m", "hvdplus.runner.horovodrun", "--gloo", "-np", "2", "true"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--gloo: hvdplus runs every job on MPI" in result.stderr


def test_horovodrun_passes_horovods_stall_and_timeline_flags_on():
    args = parse_args(["-np", "2", "--stall-check-warning-time-seconds", "10", "--stall-check-shutdown-time-seconds",
                       "20", "--timeline-mark-cycles", "python", "train.py"], prog="horovodrun")
    settings = Settings.from_env(tuning_environment(args))
    assert (settings.stall_check_seconds, settings.stall_shutdown_seconds) == (10.0, 20.0)
    assert settings.timeline_mark_cycles is True
    unchecked = parse_args(["-np", "2", "--no-stall-check", "--stall-check-warning-time-seconds", "10", "python",
                            "train.py"], prog="horovodrun")
    assert Settings.from_env(tuning_environment(unchecked)).stall_check_seconds == 0.0


@pytest.mark.mpi
@pytest.mark.slow
# Each program at one size, odd and even both among them: what the programs check is that
# Horovod's calls reach hvdplus; the arithmetic at every size is the in-rank suites' (test_mpi_suites).
@pytest.mark.parametrize("program, nranks", [("torch", 3), ("tensorflow", 2), ("tensorflow_session", 3),
                                             ("keras", 2)])
def test_horovod_programs_run_under_horovodrun(mpi_job, program, nranks):
    pytest.importorskip("torch" if program == "torch" else "tensorflow")
    run_under_horovodrun(mpi_job, program, nranks, {})


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("program, nranks", [("keras2", 3), ("keras2_elastic", 2)])
def test_keras2_programs_run_under_horovodrun_with_tf_keras(mpi_job, program, nranks):
    """Horovod's Keras 2 programs, where TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras."""
    pytest.importorskip("tf_keras")
    run_under_horovodrun(mpi_job, program, nranks, {"TF_USE_LEGACY_KERAS": "1"})


def run_under_horovodrun(mpi_job, program, nranks, env):
    """tests/horovod_programs/<program>_program.py on `nranks` ranks under horovodrun, which
    must print that it is ok on every rank."""
    command = [sys.executable, "-m", "hvdplus.runner.horovodrun", "-np", str(nranks), "--log-level", "warning",
               sys.executable, os.path.join(PROGRAMS, f"{program}_program.py")]
    result = mpi_job.run_ending_on_timeout(command, dict(os.environ, PYTHONUNBUFFERED="1", **env), 240)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    for rank in range(nranks):
        assert f"{program} program ok on rank {rank}" in result.stdout
