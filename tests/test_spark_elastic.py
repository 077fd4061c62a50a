"""hvdplus.spark.run_elastic on a real local Spark that retries failed tasks (`local[2,2]`): an
elastic job whose rank's process dies goes on in place, and one whose Spark task dies goes on
without it from the last commit and grows back onto the task Spark starts again. The training is
tests/elastic_jobs/numpy_train.py, checked by replaying its log with numpy."""

import os
import signal
import sys
import time

import cloudpickle
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from pyspark import cloudpickle as spark_cloudpickle  # noqa: E402 (after the check for pyspark)

import hvdplus.spark  # noqa: E402
from elastic_jobs import replay  # noqa: E402
from testkit import timing  # noqa: E402
from testkit.processes import assert_all_end  # noqa: E402
from testkit.spark_session import local_session  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

ELASTIC_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_jobs", "numpy_train.py")

# Neither the ranks (started from the driver) nor Spark's tasks can import this module: its
# functions travel to them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    # local[2,2]: two slots, and a failed task is tried twice.
    session = local_session("local[2,2]")
    yield session
    session.stop()


def run_script(path, *argv):
    """Run the script at `path` as a rank's __main__, with `argv`."""
    import runpy
    sys.path.insert(0, os.path.dirname(path))
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")


def job_pids(out):
    return [int(pid) for pid in os.listdir(out + ".pids")]


def check_training(out):
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    assert_all_end(job_pids(out))
    return replay.sizes(trained)


def test_an_elastic_job_goes_on_in_place_without_a_dead_rank(spark, tmp_path, capfd):
    out = str(tmp_path / "result.json")
    hvdplus.spark.run_elastic(run_script, args=(ELASTIC_JOB, out, "--kill", "1:3:step"), num_proc=2,
                              min_num_proc=1, start_timeout=60)
    sizes = check_training(out)
    assert sizes == [2] * 3 + [1] * (len(sizes) - 3), sizes
    assert "restart" not in capfd.readouterr().err


def test_fewer_tasks_than_min_num_proc_fail_within_the_timeout(spark, tmp_path):
    started = time.monotonic()
    # Spark has 2 slots, so at most 2 tasks start; on a busy machine none may have within 5 s,
    # and the message counts what did.
    with pytest.raises(TimeoutError, match=r"Spark started [0-2] of the 3 tasks the job needs .* within 5 s"):
        hvdplus.spark.run_elastic(run_script, args=(ELASTIC_JOB, str(tmp_path / "result.json")), num_proc=3,
                                  min_num_proc=3, start_timeout=5)
    timing.assert_took_under(time.monotonic() - started, 45, quiet=5.2,
                             what="an elastic Spark start short of min_num_proc failing")
    # Spark is free again: the next job runs.
    hvdplus.spark.run_elastic(run_script, args=(ELASTIC_JOB, str(tmp_path / "again.json")), num_proc=2,
                              start_timeout=60)
    check_training(str(tmp_path / "again.json"))


def grandparent(pid):
    """The process that started `pid`'s parent: for a rank, the Spark task's Python worker that
    runs its daemon."""
    def parent(of):
        with open(f"/proc/{of}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    return parent(parent(pid))


def test_an_elastic_job_survives_a_lost_task_and_goes_on_with_its_retry(spark, tmp_path, capfd):
    out = str(tmp_path / "result.json")
    import threading

    outcome = {}

    def run():
        try:
            hvdplus.spark.run_elastic(run_script, args=(ELASTIC_JOB, out, "--step-seconds", "0.15"), num_proc=2,
                                      min_num_proc=1, start_timeout=60)
        except BaseException as error:  # noqa: BLE001 - raised below
            outcome["error"] = error

    job = threading.Thread(target=run)
    job.start()
    deadline = time.monotonic() + 90
    while not os.path.exists(out + ".starts") or len(open(out + ".starts").read().split()) < 4:
        assert time.monotonic() < deadline and job.is_alive(), "the job never reached step 4"
        time.sleep(0.05)
    task = grandparent(sorted(job_pids(out))[-1])
    os.kill(task, signal.SIGKILL)
    job.join(timeout=180)
    assert not job.is_alive() and "error" not in outcome, outcome
    sizes = check_training(out)
    # Two ranks to the end: the job restarts from its last commit on the task left and the
    # task Spark started again (a new host), or on the one left first and grows back onto the
    # new one, as Spark's retry comes before the restart or after it.
    assert sizes[:4] == [2] * 4 and sizes[-1] == 2, sizes
    assert "the job lost a host; restart 1 of at most 3" in capfd.readouterr().err


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_tasks_that_arrive_and_leave_together_are_all_listed_then_all_dropped():
    """The driver's board lists each connected task for the discovery script, whatever the
    order in which many of them come and go at once."""
    import subprocess
    import threading

    from hvdplus.spark.elastic import _TaskBoard, join_board

    board = _TaskBoard("127.0.0.1")
    hosts = [f"task-{i}" for i in range(24)]
    start = threading.Barrier(len(hosts))
    connections = []

    def connect(host):
        start.wait()
        connections.append(join_board(board.address, board.key, host).connection)

    def listed():
        return sorted(subprocess.run([board.discovery_script], capture_output=True, text=True,
                                     check=True).stdout.split())

    def wait_for(expected):
        deadline = time.monotonic() + 30
        while listed() != expected:
            assert time.monotonic() < deadline, f"the discovery script lists {listed()}, not {expected}"
            time.sleep(0.05)

    try:
        threads = [threading.Thread(target=connect, args=(host,)) for host in hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wait_for(sorted(f"{host}:1" for host in hosts))
        for connection in connections:
            connection.close()
        wait_for([])  # each departure is seen: no admitting thread failed
        assert board.hosts() == []
    finally:
        board.close()
