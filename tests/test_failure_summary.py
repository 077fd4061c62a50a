"""A failed job ends with one summary: which ranks failed, on which hosts, with what exception
raised at which of the user's lines, and each traceback once, without the launcher's frames.

One-process tests cover the parts (the ranks' reports, the summary's text, the folding of MPI's
abort messages); the `mpi` ones run a one-line mistake on 2 ranks in each form hvdplusrun starts
a program in (`python script.py`, `-m module`, `-c code`), through hvdplus.run, and in an elastic
job, and check that the whole output stays short."""

import inspect
import io
import os
import socket
import sys
import time

import cloudpickle
import pytest

import hvdplus
from hvdplus.common import rank_errors
from hvdplus.common.rank_errors import RankFailure
from hvdplus.runner import exit_guard
from hvdplus.runner.abort_banners import AbortBannerFolder
from hvdplus.runner.dynamic_code import DYNAMIC_FILE, restore_sources, source_files
from hvdplus.runner.failure_summary import FailureReport, format_summary

from testkit import timing
from testkit.mpich import mpich_job_env
from testkit.programs import program

HOST = socket.gethostname()
# The launcher's own frames, which no summary shows.
LAUNCHER_FRAMES = ("runpy", "exit_guard", "run_rank")
# The most lines a job of 2 ranks may print for a one-line mistake, summary included.
MOST_LINES = 25
# A tiny program with a one-line mistake on the ranks in RAISING; the others sleep, to show
# that the mistake ends the job.
MISTAKE = '''import time

import hvdplus as hvd

hvd.init()
settings = {{"lr": 0.1}}
if hvd.rank() in {raising}:
    print(settings["learning_rate"])
time.sleep(30)
'''
MISTAKE_LINE = 8
RAISING = {"both": (0, 1), "one": (1,)}

# Open MPI's message from a rank that called MPI_Abort, and prterun's after it.
TAG = b"[1,1]<stderr>: "
DASHES = b"-" * 74 + b"\n"
RANK_ABORT = [TAG + line for line in (
    DASHES, b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n", b"  Proc: [[29255,1],1]\n",
    b"  Errorcode: 1\n", b"\n", b"NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n",
    b"You may or may not see output from other processes, depending on\n", b"exactly when Open MPI kills them.\n",
    DASHES)]
LAUNCHER_ABORT = [DASHES, b"prterun has exited due to process rank 0 with PID 0 on node vm calling\n",
                  b'"abort". This may have caused other processes in the application to be\n',
                  b"terminated by signals sent by prterun (as reported here).\n", DASHES]
FOLDED = b" (MPI's message folded; --verbose shows it whole)\n"


def folded(stream: bytes, read_size: int) -> bytes:
    out = io.BytesIO()
    folder = AbortBannerFolder(out)
    for at in range(0, len(stream), read_size):
        folder.write(stream[at:at + read_size])
    folder.close()
    return out.getvalue()


# -- MPI's messages about an abort --------------------------------------------------------------
@pytest.mark.parametrize("read_size", [1, 7, 4096])
def test_open_mpis_abort_messages_fold_into_one_line_each(read_size):
    others = b"[1,0]<stdout>: step 3\n"
    # Another rank's line in the middle of the block, and the NUL that Open MPI ends it with.
    stream = b"".join(RANK_ABORT[:3]) + others + b"".join(RANK_ABORT[3:]) + b"".join(LAUNCHER_ABORT) + TAG + b"\x00"
    assert folded(stream, read_size) == (
        others + TAG + b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD with errorcode 1" + FOLDED
        + b'prterun has exited due to process rank 0 with PID 0 on node vm calling "abort"' + FOLDED)


def test_open_mpis_message_of_a_rank_that_exited_with_an_error_folds_too():
    stream = b"".join([DASHES, b"prterun detected that one or more processes exited with non-zero status,\n",
                       b"thus causing the job to be terminated. The first process to do so was:\n", b"\n",
                       b"   Process name: [prterun-vm-5995@1,1]\n", b"   Exit code:    3\n", DASHES])
    assert folded(stream, 5) == (b"prterun detected that one or more processes exited with non-zero status: first "
                                 b"[prterun-vm-5995@1,1], exit code 3" + FOLDED)


@pytest.mark.parametrize("read_size", [1, 7, 4096])
def test_mpichs_abort_lines_fold_into_the_first(read_size):
    first = b"[1] Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1) - process 1\n"
    stream = first + b"[0] step\n[0] application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0\n"
    assert folded(stream, read_size) == first + b"[0] step\n"


@pytest.mark.parametrize("read_size", [1, 7, 4096])
@pytest.mark.parametrize("text", [
    DASHES + b"| epoch | loss |\n" + DASHES + b"| 1 | 0.5 |\n" + DASHES,  # a table
    b"".join(line for line in LAUNCHER_ABORT if b"abort" not in line),  # another message of prterun's
    b"\r 10%\r 20%",  # a progress bar, never finished
    TAG + DASHES + TAG + DASHES + TAG + b"after\n",
], ids=["table", "other-message", "progress-bar", "dashes-twice"])
def test_other_output_passes_unchanged(read_size, text):
    out = folded(text, read_size)
    assert out == text + (b"" if text.endswith(b"\n") else b"\n")  # the stream is left at a line's start


def test_unfinished_output_passes_at_once():
    out = io.BytesIO()
    folder = AbortBannerFolder(out)
    folder.write(b"[1,0]<stderr>: \r 10%")
    assert out.getvalue() == b"[1,0]<stderr>: \r 10%"


# -- what a rank reports ---------------------------------------------------------------------
def test_a_report_travels_as_one_message_and_back():
    failure = RankFailure(1, "KeyError", "'b'", "Traceback ...\nKeyError: 'b'\n", "node1", "train.py", 4, 1)
    assert RankFailure.from_message(failure.to_message()) == failure
    exit = rank_errors.exit_report(2, 3)
    assert exit.to_message()["exited"] == 2 and RankFailure.from_message(exit.to_message()) == exit
    assert RankFailure.from_message({"restart": "failure"}) is None


def test_the_traceback_loses_the_frames_that_started_the_users_code(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import json\n\ndef load():\n    return json.loads('{')\n\nload()\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the guard sets both, as for a program of its own
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(rank_errors.REPORT_ENV, raising=False)
    with pytest.raises(ValueError) as raised:
        exit_guard.main([str(script)])
    error = raised.value.with_traceback(raised.value.__traceback__.tb_next)  # from the guard on, as in a rank
    text = rank_errors.trimmed_traceback(error)
    assert text.startswith(f'Traceback (most recent call last):\n  File "{script}", line 6, in <module>\n'), text
    assert "runpy" not in text and "exit_guard" not in text and os.path.join("json", "decoder.py") in text
    # The line named is the user's, not the library's below it.
    assert rank_errors.raised_at(error) == (str(script), 4)


def test_hvdplus_runs_function_gets_its_file_and_source_lines_back():
    def misconfigured():
        settings = {"lr": 0.1}
        return settings["learning_rate"]  # the mistake

    # As a rank has it: cloudpickle sends it by value, its code named "<dynamic-code>".
    with pytest.raises(KeyError) as raised:
        cloudpickle.loads(cloudpickle.dumps(misconfigured))()
    report = rank_errors.raised_report(raised.value, 0, exit_code=1)
    assert report.file == DYNAMIC_FILE
    restored = restore_sources(report, source_files(misconfigured))
    source, first_line = inspect.getsourcelines(misconfigured)
    assert (restored.file, restored.line) == (__file__, first_line + 2)
    assert f'File "{__file__}", line {first_line + 2}, in misconfigured\n' in restored.traceback
    assert '    return settings["learning_rate"]  # the mistake\n' in restored.traceback


# -- the summary -------------------------------------------------------------------------------
def test_identical_tracebacks_show_once_naming_their_ranks():
    trace = 'Traceback (most recent call last):\n  File "train.py", line 4, in <module>\nKeyError: \'b\'\n'
    failures = {rank: RankFailure(rank, "KeyError", "'b'", trace, f"node{rank}", "train.py", 4, 1) for rank in (0, 1)}
    failures[2] = rank_errors.exit_report(2, 3)
    text = format_summary(failures, 1, "hvdplusrun: ", first=1)
    assert text.splitlines() == [
        "hvdplusrun: the job failed (exit status 1); ranks 0, 1 and 2 failed:",
        "  rank 0 on host node0: KeyError: 'b', at train.py:4 (exit code 1)",
        "  rank 1 on host node1: KeyError: 'b', at train.py:4 (exit code 1; reported first)",
        f"  rank 2 on host {HOST}: exited with status 3",
        "hvdplusrun: traceback of ranks 0 and 1:",
        "  Traceback (most recent call last):",
        '    File "train.py", line 4, in <module>',
        "  KeyError: 'b'",
    ]


def test_the_report_keeps_the_first_failure_first_and_passes_other_messages():
    report = FailureReport()
    assert not report.take({"restart": "failure"})
    assert report.take(RankFailure(1, "KeyError", "'b'", "").to_message())
    assert report.take(rank_errors.exit_report(0, 3).to_message())
    assert [failure.rank for failure in report.failures()] == [1, 0]
    assert list(report.raised()) == [1]


# -- real jobs ---------------------------------------------------------------------------------
def summary_of(output: str) -> str:
    start = output.find("the job failed")
    assert start >= 0, output
    return output[start:]


def assert_short_summary(output: str, ranks, file: str, line: int):
    summary = summary_of(output)
    named = [rank for rank in ranks if f"rank {rank} on host {HOST}: KeyError: 'learning_rate', at {file}:{line}"
             in summary]
    # Every rank raises at once: the first to abort the job may end another before it has reported.
    assert named if len(ranks) > 1 else named == list(ranks), output
    for frame in LAUNCHER_FRAMES:
        assert frame not in output, output
    assert output.count("Traceback (most recent call last)") == 1, output
    assert len(output.splitlines()) <= MOST_LINES, output


def mistake_program(tmp_path, form: str, raising: str):
    """The command line of the tiny program in `form`, its environment, and the file and line
    its mistake is at."""
    code = MISTAKE.format(raising=RAISING[raising])
    if form == "-c":
        return [sys.executable, "-c", code], {}, "<string>"
    (tmp_path / "misconfigured.py").write_text(code)
    if form == "-m":
        path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        return [sys.executable, "-m", "misconfigured"], {"PYTHONPATH": path}, str(tmp_path / "misconfigured.py")
    return [sys.executable, str(tmp_path / "misconfigured.py")], {}, str(tmp_path / "misconfigured.py")


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("raising", sorted(RAISING))
@pytest.mark.parametrize("form", ["script", "-m", "-c"])
def test_hvdplusrun_ends_a_failed_job_with_one_short_summary(mpi_job, tmp_path, form, raising):
    command, env, file = mistake_program(tmp_path, form, raising)
    started = time.monotonic()
    result = mpi_job(2, command, env=env, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    timing.assert_took_under(time.monotonic() - started, 20, quiet=2.7, what="a failed job ending")
    output = result.stdout + result.stderr
    assert_short_summary(output, RAISING[raising], file, MISTAKE_LINE)
    assert "(exit code 1" in summary_of(output)


@pytest.mark.mpi
@pytest.mark.timeout(300)  # the first test on MPICH builds its environment
@pytest.mark.parametrize("raising", sorted(RAISING))
def test_hvdplusrun_ends_a_failed_job_on_mpich_with_one_short_summary(mpi_job, mpich_python, tmp_path, raising):
    _, _, file = mistake_program(tmp_path, "script", raising)
    result = mpi_job(2, [mpich_python, file], env=mpich_job_env(mpich_python), timeout=60, python=mpich_python)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert_short_summary(output, RAISING[raising], file, MISTAKE_LINE)
    assert output.count("application called MPI_Abort") <= 1, output


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_verbose_shows_mpis_messages_and_the_tracebacks_whole(mpi_job, tmp_path):
    command, env, _ = mistake_program(tmp_path, "script", "one")
    result = mpi_job(2, command, env=env, timeout=60, launcher_args=["--verbose"])
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "MPI's message folded" not in output
    assert "This may have caused other processes" in output or "NOTE: invoking MPI_ABORT" in output, output
    raw_traceback = output[:output.find("the job failed")]
    assert "Traceback (most recent call last)" in raw_traceback and "exit_guard.py" in raw_traceback, output
    assert f"rank 1 on host {HOST}: KeyError: 'learning_rate'" in summary_of(output)


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_an_elastic_job_ends_with_the_summary_too(mpi_job):
    result = mpi_job(2, program("elastic_job_with_a_bug"), launcher_args=["--min-np", "1"], timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    job_file = program("elastic_job_with_a_bug")[1]
    assert (f"rank 1 on host {HOST}: KeyError: 'a bug in the training script', at {job_file}:14"
            in summary_of(output))


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("raising", sorted(RAISING))
def test_hvdplus_run_raises_the_summary(capfd, raising):
    def misconfigured(raising_ranks):
        import time

        import hvdplus as hvd
        hvd.init()
        settings = {"lr": 0.1}
        if hvd.rank() in raising_ranks:
            return settings["learning_rate"]  # the mistake
        time.sleep(30)

    source, first_line = inspect.getsourcelines(misconfigured)
    line = first_line + next(index for index, text in enumerate(source) if "the mistake" in text)
    with pytest.raises(hvdplus.RanksRaisedError) as raised:
        hvdplus.run(misconfigured, args=(RAISING[raising],), np=2)
    assert raised.value.status != 0
    printed = capfd.readouterr()
    assert_short_summary(printed.out + printed.err + str(raised.value), RAISING[raising], __file__, line)
    failure = next(iter(raised.value.failures.values()))
    assert (failure.host, failure.file, failure.line, failure.exit_code) == (HOST, __file__, line, 1)
