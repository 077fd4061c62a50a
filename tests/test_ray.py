"""hvdplus.ray on a real local Ray (`ray.init(num_cpus=2)`): the ranks of one MPI job in Ray
actors, their results in rank order, a torch DistributedOptimizer trained through them equal to
one process training alone, and a clear error when Ray cannot place the workers."""

import os
import time

import cloudpickle
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")

from elastic_jobs import replay  # noqa: E402
from hvdplus.ray import RayExecutor  # noqa: E402 (after the check for ray)
from testkit import timing  # noqa: E402
from testkit.local_ray import local_ray as local_ray_session  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

ELASTIC_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_jobs", "numpy_train.py")


@pytest.fixture(scope="module")
def local_ray():
    with local_ray_session():
        yield


@pytest.fixture
def executor_2(local_ray):
    executor = RayExecutor(2)
    executor.start()
    yield executor
    executor.shutdown()


@pytest.fixture
def executor(local_ray, request):
    workers, cpus = request.param
    executor = RayExecutor(workers, cpus_per_worker=cpus)
    executor.start()
    yield executor
    executor.shutdown()


@pytest.mark.parametrize("executor", [(2, 1), (3, 0.5)], ids=["2-workers", "3-workers"], indirect=True)
def test_each_ranks_return_value_comes_back_in_rank_order(executor):
    def sums(scale):
        import os

        import numpy as np

        import hvdplus as hvd
        hvd.init()
        return hvd.rank(), hvd.size(), os.getpid(), hvd.allreduce(np.arange(3.0) * (hvd.rank() + 1) * scale,
                                                                   op=hvd.Sum)

    results = executor.run(sums, args=(2.0,))
    workers = executor.num_workers
    expected = sum((rank + 1) for rank in range(workers)) * 2.0 * np.arange(3.0)
    assert [(rank, size) for rank, size, _, _ in results] == [(rank, workers) for rank in range(workers)]
    for _, _, _, total in results:
        assert list(total) == list(expected)
    # The ranks are processes of the actors' own (daemon children), one per worker.
    assert len({pid for _, _, pid, _ in results}) == workers and all(pid != os.getpid() for _, _, pid, _ in results)
    assert executor.execute(lambda worker: worker * 10) == [10 * index for index in range(workers)]


@pytest.mark.parametrize("executor", [(2, 1)], ids=["2-workers"], indirect=True)
def test_distributed_optimizer_through_ray_trains_like_one_process(executor):
    torch_shards = pytest.importorskip("testkit.torch_shards")
    torch_shards.register_by_value(cloudpickle)
    results = executor.run(torch_shards.train_on_shards, args=(torch_shards.model, torch_shards.batches()))
    torch_shards.assert_trains_like_one_process(results, torch_shards.model, torch_shards.batches())


def test_more_workers_than_ray_has_cpus_fail_within_the_timeout(local_ray):
    executor = RayExecutor(3, cpus_per_worker=1, start_timeout=3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"could not place 3 workers .* within 3 s; the cluster has 2 CPUs"):
        executor.start()
    timing.assert_took_under(time.monotonic() - started, 10, quiet=3.1, what="a start past Ray's CPUs failing")


def test_run_remote_hands_back_one_reference_per_rank(executor_2):
    def identify(offset):
        import hvdplus as hvd
        hvd.init()
        return hvd.rank() + offset

    references = executor_2.run_remote(identify, args=(10,))
    assert len(references) == 2 and ray.get(references, timeout=60) == [10, 11]


def script_runner():
    """A function that runs the script at `path` as a rank's __main__, with `argv`. Made inside
    a function, cloudpickle sends it whole: the ranks cannot import this module."""
    def run_script(path, *argv):
        import runpy
        import sys
        sys.path.insert(0, os.path.dirname(path))
        sys.argv = [path, *argv]
        runpy.run_path(path, run_name="__main__")
    return run_script


def test_an_elastic_job_goes_on_in_place_without_a_dead_rank(local_ray, tmp_path, capfd):
    # The rank's process dies (SIGKILL, from the job itself), its actor and daemon live: ULFM.
    executor = RayExecutor(2, min_workers=1)
    executor.start()
    out = str(tmp_path / "result.json")
    try:
        executor.run(script_runner(), args=(ELASTIC_JOB, out, "--kill", "1:3:step"))
    finally:
        executor.shutdown()
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    assert replay.sizes(trained) == [2] * 3 + [1] * (len(replay.sizes(trained)) - 3), replay.sizes(trained)
    assert "restart" not in capfd.readouterr().err


def test_an_elastic_job_survives_a_killed_actor_from_its_last_commit(local_ray, tmp_path, capfd):
    # ray.kill of a worker's actor takes its daemon with it: to Open MPI a lost host, which ends
    # every rank. The launcher restarts the job on the worker left, which resumes from the last
    # commit on its disk, and grows back onto the actor Ray places in the dead one's bundle.
    executor = RayExecutor(2, min_workers=1)
    executor.start()
    out = str(tmp_path / "result.json")
    try:
        references = executor.run_remote(script_runner(), args=(ELASTIC_JOB, out, "--step-seconds", "0.15"))
        deadline = time.monotonic() + 60
        while not os.path.exists(out + ".starts") or len(open(out + ".starts").read().split()) < 4:
            assert time.monotonic() < deadline, "the job never reached step 4"
            time.sleep(0.05)
        victim = executor.workers[1]
        ray.kill(victim)
        ray.get(references, timeout=120)
        assert victim not in executor.workers and len(executor.workers) == 2
    finally:
        executor.shutdown()
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    sizes = replay.sizes(trained)
    # Two ranks, one after the kill, two again once the new actor is up.
    assert sizes[:4] == [2] * 4 and 1 in sizes and sizes[-1] == 2, sizes
    output = capfd.readouterr().err
    assert "the job lost a host; restart 1 of at most 3" in output and "restarting the job on the new slots" in output
