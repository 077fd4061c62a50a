"""Engine behaviour that needs a job of its own: stalls, timelines, shutdown, failures. Each
job is a program under tests/jobs/."""

import json
import re
import time

import pytest

from testkit import timing
from testkit.programs import program

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]


def run_job(mpi_job, nranks, command, env=None, timeout=90, launcher_args=()):
    started = time.monotonic()
    result = mpi_job(nranks, command, env=env, timeout=timeout, launcher_args=launcher_args)
    return result, time.monotonic() - started


def test_stall_warning_comes_once_per_check_time_naming_the_missing_rank(mpi_job):
    # Rank 1 submits 5 s late; a 2 s check warns at 2 s and at 4 s, not every second from 2 s on.
    result, _ = run_job(mpi_job, 2, program("late_allreduce", "--delay", 5),
                        env={"HVDPLUS_STALL_CHECK_TIME_SECONDS": "2"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count("hvdplus: stalled collectives") == 2, output
    assert "allreduce 'late_tensor' waited" in output and "missing on ranks [1]" in output
    assert "rank 1 submitted meanwhile: nothing yet" in output
    assert output.count("result [2. 2.]") == 2


@pytest.mark.parametrize("nranks", [2, 3])
def test_stall_shutdown_raises_on_every_rank_naming_the_stall(mpi_job, nranks):
    shutdown_s = 3
    result, _ = run_job(mpi_job, nranks, program("mismatched_allreduce_names"),
                        env={"HVDPLUS_STALL_CHECK_TIME_SECONDS": "1",
                             "HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS": str(shutdown_s)})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    waited = dict(re.findall(r"rank (\d) StalledError after ([\d.]+) s", output))
    assert sorted(waited) == [str(rank) for rank in range(nranks)], output
    # Rank 1 submitted half a second after rank 0, whose collective the shutdown time counts from.
    assert shutdown_s - 0.1 <= float(waited["0"]) <= shutdown_s + 5, output
    assert all(float(seconds) <= shutdown_s + 5 for seconds in waited.values()), output
    assert "rank 1 StalledError after" in output and "'something_else': hvdplus ended the job's collectives" in output
    submitters = [rank for rank in range(nranks) if rank != 1]
    assert f"allreduce 'never_matched' waited 3 s: submitted by ranks {submitters}, missing on ranks [1]" in output
    assert "rank 1 submitted meanwhile: allreduce 'something_else'" in output


def test_an_uncaught_stall_ends_the_job_with_a_failure(mpi_job):
    # Horovod's variables; rank 1 never reaches a collective, and sleeps for minutes.
    result, elapsed = run_job(mpi_job, 2, program("mismatched_allreduce_names", "--rank-1-idle", "--uncaught"),
                              env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "StalledError" in output and "missing on ranks [1]" in output
    assert "rank 1 submitted meanwhile: nothing yet" in output
    assert "outlived the stall shutdown" not in output
    timing.assert_took_under(elapsed, 40, quiet=4.8, what="a job with an uncaught stall ending")


def read_trace(path, terminated):
    text = path.read_text()
    if not terminated:
        # What chrome://tracing and Perfetto do with a trace cut off mid-run.
        text = text.rstrip().rstrip(",") + "]"
    return json.loads(text)


@pytest.mark.parametrize("abrupt", [False, True], ids=["normal-exit-marking-cycles", "killed"])
def test_timeline_is_a_chrome_trace(mpi_job, tmp_path, abrupt):
    path = tmp_path / "timeline.json"
    flags = ["--exit-abruptly"] if abrupt else []
    # Cycles marked by Horovod's variable in one case, unmarked in the other.
    env = {"HVDPLUS_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "0" if abrupt else "1"}
    result, _ = run_job(mpi_job, 2, program("fused_allreduces_timeline", *flags), env=env)
    # An abrupt exit skips MPI_Finalize, which mpirun reports as a failure; that is the point.
    assert abrupt or result.returncode == 0, result.stdout + result.stderr
    events = read_trace(path, terminated=not abrupt)
    phases = {event["name"] for event in events}
    assert {"NEGOTIATE_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER",
            "ALLGATHER"} <= phases
    rows = {event["args"]["name"] for event in events if event["name"] == "thread_name"}
    assert {"allreduce.layer0", "allreduce.layer19", "allgather.gathered"} <= rows
    cycles = [event for event in events if event["name"] == "CYCLE_START"]
    if abrupt:
        assert cycles == []
    else:
        assert all(event["ph"] == "i" for event in cycles)
        # One per cycle that ran batches: at least the all-reduces' and the all-gather's, at most
        # one per collective and one for the shutdown; never one per idle cycle.
        assert 2 <= len(cycles) <= 21 + 1
        first_collective = min(event["ts"] for event in events if event["name"] in ("ALLREDUCE", "ALLGATHER"))
        assert cycles[0]["ts"] <= first_collective
    fused = [event["args"]["tensors"] for event in events if event["name"] == "MEMCPY_IN_FUSION_BUFFER"]
    assert max(fused) > 1, "10 float16 tensors submitted at once should share a fusion buffer"
    together = [event["args"].get("tensors", 1) for event in events if event["name"] == "ALLREDUCE"]
    assert max(together) > 1


def test_pending_handles_fail_clearly_at_shutdown(mpi_job):
    result, elapsed = run_job(mpi_job, 2, program("handle_pending_at_shutdown"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "rank 1 ShutdownError: 'orphan'" in output
    timing.assert_took_under(elapsed, 30, quiet=2.4, what="a job with pending handles shutting down")


def test_a_rank_exiting_early_fails_the_others_instead_of_hanging(mpi_job):
    # Without hvdplusrun's exit guard, which would end the job before the others notice.
    result, elapsed = run_job(mpi_job, 2, program("one_rank_leaves_early", "--rank", "1", "--exit", "3"),
                              launcher_args=["--no-exit-guard"])
    assert result.returncode != 0
    assert "waits_for_rank_1" in result.stdout + result.stderr
    timing.assert_took_under(elapsed, 30, quiet=2.3, what="the others failing after a rank exited")


def test_timeline_started_and_stopped_at_runtime(mpi_job, tmp_path):
    path = tmp_path / "runtime.json"
    result, _ = run_job(mpi_job, 2, program("timeline_started_at_runtime", path))
    assert result.returncode == 0, result.stdout + result.stderr
    events = read_trace(path, terminated=True)
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} == {"allreduce.recorded"}
    assert any(e["name"] == "CYCLE_START" for e in events), "start_timeline(mark_cycles=True) marks cycles"
