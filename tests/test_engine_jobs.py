"""Engine behaviour that needs a job of its own: stalls, timelines, shutdown, failures. Each
job is a program under tests/jobs/."""

import json
import time

import pytest

from testkit.programs import program

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]


def run_job(mpi_job, nranks, command, env=None, timeout=90, launcher_args=()):
    started = time.monotonic()
    result = mpi_job(nranks, command, env=env, timeout=timeout, launcher_args=launcher_args)
    return result, time.monotonic() - started


def test_stall_warning_names_tensor_and_missing_rank(mpi_job):
    result, _ = run_job(mpi_job, 2, program("late_allreduce"), env={"HVDPLUS_STALL_CHECK_TIME_SECONDS": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "stalled collectives" in output
    assert "'late_tensor'" in output and "missing on ranks [1]" in output
    assert output.count("result [2. 2.]") == 2


def test_stall_shutdown_raises_on_every_rank_instead_of_hanging(mpi_job):
    result, elapsed = run_job(mpi_job, 2, program("mismatched_allreduce_names"),
                              env={"HVDPLUS_STALL_CHECK_TIME_SECONDS": "1", "HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "rank 0 StalledError" in output and "rank 1 StalledError" in output
    assert elapsed < 30


def read_trace(path, terminated):
    text = path.read_text()
    if not terminated:
        # What chrome://tracing and Perfetto do with a trace cut off mid-run.
        text = text.rstrip().rstrip(",") + "]"
    return json.loads(text)


@pytest.mark.parametrize("abrupt", [False, True], ids=["normal-exit", "killed"])
def test_timeline_is_a_chrome_trace(mpi_job, tmp_path, abrupt):
    path = tmp_path / "timeline.json"
    flags = ["--exit-abruptly"] if abrupt else []
    result, _ = run_job(mpi_job, 2, program("fused_allreduces_timeline", *flags), env={"HVDPLUS_TIMELINE": str(path)})
    # An abrupt exit skips MPI_Finalize, which mpirun reports as a failure; that is the point.
    assert abrupt or result.returncode == 0, result.stdout + result.stderr
    events = read_trace(path, terminated=not abrupt)
    phases = {event["name"] for event in events}
    assert {"NEGOTIATE_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER",
            "ALLGATHER"} <= phases
    rows = {event["args"]["name"] for event in events if event["name"] == "thread_name"}
    assert {"layer0", "layer19", "gathered"} <= rows
    fused = [event["args"]["tensors"] for event in events if event["name"] == "MEMCPY_IN_FUSION_BUFFER"]
    assert max(fused) > 1, "10 float16 tensors submitted at once should share a fusion buffer"
    together = [event["args"].get("tensors", 1) for event in events if event["name"] == "ALLREDUCE"]
    assert max(together) > 1


def test_pending_handles_fail_clearly_at_shutdown(mpi_job):
    result, elapsed = run_job(mpi_job, 2, program("handle_pending_at_shutdown"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "rank 1 ShutdownError: 'orphan'" in output
    assert elapsed < 30


def test_a_rank_exiting_early_fails_the_others_instead_of_hanging(mpi_job):
    # Without hvdplusrun's exit guard, which would end the job before the others notice.
    result, elapsed = run_job(mpi_job, 2, program("one_rank_leaves_early", "--rank", "1", "--exit", "3"),
                              launcher_args=["--no-exit-guard"])
    assert result.returncode != 0
    assert "waits_for_rank_1" in result.stdout + result.stderr
    assert elapsed < 30


def test_timeline_started_and_stopped_at_runtime(mpi_job, tmp_path):
    path = tmp_path / "runtime.json"
    result, _ = run_job(mpi_job, 2, program("timeline_started_at_runtime", path))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {e["args"]["name"] for e in read_trace(path, terminated=True) if e["name"] == "thread_name"}
    assert rows == {"recorded"}
