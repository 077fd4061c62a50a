"""`hvdplus.run(fn, np=N)`: jobs started from Python, whose ranks' return values come back in
rank order, whose errors come back named by rank within seconds, and which Ctrl-C ends.

The functions are defined inside the tests, so cloudpickle sends them by value, as it does a
notebook's; tests/jobs/run_from_main.py calls hvdplus.run on a function of `__main__`."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hvdplus
from testkit import timing
from testkit.mpi_jobs import REPO
from testkit.mpich import mpich_job_env
from testkit.processes import assert_all_end, kill_leftovers, pids_in
from testkit.programs import program

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_each_ranks_return_value_comes_back_in_rank_order(nranks):
    def ranks_sum(scale):
        import numpy as np

        import hvdplus as hvd
        hvd.init()
        mine = np.arange(4.0) * (hvd.rank() + 1) * scale
        return hvd.rank(), hvd.size(), hvd.allreduce(mine, op=hvd.Sum)

    results = hvdplus.run(ranks_sum, args=(0.5,), np=nranks)
    expected = sum(np.arange(4.0) * (rank + 1) * 0.5 for rank in range(nranks))
    assert [(rank, size) for rank, size, _ in results] == [(rank, nranks) for rank in range(nranks)]
    for _, _, total in results:
        np.testing.assert_allclose(total, expected)


def test_a_function_of_main_runs(tmp_path):
    result = subprocess.run(program("run_from_main", "3"), cwd=REPO, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    returned = json.loads(result.stdout.strip().splitlines()[-1])
    assert returned == [{"rank": rank, "greeting": f"hello from rank {rank} of 3"} for rank in range(3)]


def test_a_rank_that_raises_fails_the_call_within_seconds_while_a_peer_computes(tmp_path):
    raised_at = tmp_path / "raised_at"

    def fails_on_rank_1(path):
        import time

        import hvdplus as hvd
        hvd.init()
        if hvd.rank() == 1:
            with open(path, "w") as file:
                file.write(repr(time.time()))
            raise ValueError("bad input on rank 1")
        time.sleep(60)

    with pytest.raises(hvdplus.RanksRaisedError) as raised:
        hvdplus.run(fails_on_rank_1, args=(str(raised_at),), np=2)
    seconds = time.time() - float(raised_at.read_text())
    timing.assert_took_under(seconds, 5, quiet=0.3, what="hvdplus.run returning after rank 1 raised")
    assert list(raised.value.failures) == [1]
    failure = raised.value.failures[1]
    assert (failure.type, failure.message) == ("ValueError", "bad input on rank 1")
    assert "in fails_on_rank_1" in failure.traceback and failure.traceback.endswith("bad input on rank 1\n")
    assert "rank 1" in str(raised.value) and "ValueError: bad input on rank 1" in str(raised.value)


def test_an_elastic_run_survives_a_killed_rank(tmp_path):
    def counts_until_done(folder):
        import os
        import signal

        import numpy as np

        import hvdplus as hvd
        hvd.init()
        state = hvd.elastic.ObjectState(total=0.0, sizes=[])

        @hvd.elastic.run
        def train(state):
            while len(state.sizes) < 8:
                if len(state.sizes) == 3 and hvd.rank() == 2 and not os.path.exists(os.path.join(folder, "killed")):
                    open(os.path.join(folder, "killed"), "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)
                state.total += float(hvd.allreduce(np.ones(1), op=hvd.Sum, name="count")[0])
                state.sizes.append(hvd.size())
                state.commit()

        train(state)
        return hvd.rank(), state.total, state.sizes

    results = hvdplus.run(counts_until_done, args=(str(tmp_path),), np=3, min_np=1)
    assert [rank for rank, _, _ in results] == [0, 1]
    for _, total, sizes in results:
        assert sizes == [3, 3, 3, 2, 2, 2, 2, 2]
        assert total == sum(sizes)  # each committed step added the size it ran at, once


def test_ctrl_c_in_the_caller_ends_every_rank(tmp_path):
    caller = subprocess.Popen(program("run_from_main", "2", "--sleep", str(tmp_path)), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(pids_in(tmp_path)) < 2:
            assert caller.poll() is None and time.monotonic() < deadline, caller.communicate()
            time.sleep(0.1)
        caller.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = caller.communicate(timeout=30)
        timing.assert_took_under(time.monotonic() - sent, 5, quiet=0.4, what="the caller ending on Ctrl-C")
        assert "KeyboardInterrupt" in stderr, stderr[-3000:]
        assert_all_end(pids_in(tmp_path), seconds=1)
    finally:
        caller.kill()
        kill_leftovers(pids_in(tmp_path))


def test_a_job_on_mpich(mpich_python):
    result = subprocess.run(program("run_from_main", "2", python=mpich_python), cwd=REPO, capture_output=True,
                            text=True, timeout=100, env=dict(os.environ, **mpich_job_env(mpich_python)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])[1]["greeting"] == "hello from rank 1 of 2"


def test_a_large_argument_on_mpich(mpich_python):
    result = subprocess.run([mpich_python, os.path.join(REPO, "tests", "containers", "large_payload_job.py"), "3",
                             "20"], cwd=REPO, capture_output=True, text=True, timeout=100,
                            env=dict(os.environ, **mpich_job_env(mpich_python)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(json.loads(result.stdout.strip().splitlines()[-1])["hosts"]) == 3


def test_launcher_options_go_by_their_names():
    def nothing():
        return None

    with pytest.raises(TypeError, match="unexpected keyword argument 'fusion_treshold_mb'.*fusion_threshold_mb"):
        hvdplus.run(nothing, np=2, fusion_treshold_mb=32)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_200_mb_argument_reaches_every_rank_and_200_mb_results_come_back_whole():
    # Far past what the ranks' environment holds: the argument is served to rank 0 and broadcast.
    result = subprocess.run([sys.executable, os.path.join(REPO, "tests", "containers", "large_payload_job.py"),
                             "2", "200"], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(json.loads(result.stdout.strip().splitlines()[-1])["hosts"]) == 2


def test_horovod_run_is_hvdplus_run_through_the_alias():
    from hvdplus import horovod_alias
    check = "import horovod, hvdplus; assert horovod.run is hvdplus.run"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=horovod_alias.PATH))
    assert result.returncode == 0, result.stderr[-3000:]
