"""hvdplus.ray.HvdplusConfig, the Ray Train backend, on a real local Ray (`ray.init(num_cpus=2)`):
two training workers form one MPI job and train a torch model as one process would, report
metrics and checkpoints, resume from the last checkpoint, and a rank that raises fails the run
with its own error. The placeholder rank is checked by itself first, without Ray.

    pytest tests/test_ray_train.py
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
torch = pytest.importorskip("torch", reason="torch is not installed")

from ray.train import (  # noqa: E402 (after the check for ray)
    FailureConfig, RunConfig, ScalingConfig, WorkerGroupError,
)
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402

from hvdplus.ray import HvdplusConfig  # noqa: E402
from hvdplus.ray.placeholder import DONE_FILE, ENVIRONMENT_FILE, OWNER_ENV, PROXY_DIR_ENV  # noqa: E402
from testkit import timing  # noqa: E402
from testkit.local_ray import local_ray as local_ray_session  # noqa: E402

pytestmark = [pytest.mark.mpi]

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "ray_torch_digits.py")
sys.path.insert(0, os.path.dirname(EXAMPLE))
import ray_torch_digits as example  # noqa: E402 (its checkpoint helpers are the ones under test)

# The training loops below, and the example's helpers, travel to Ray's workers by value: neither
# module is importable there.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(example)

WORKERS = 2
ROWS_PER_WORKER = 4
LEARNING_RATE = 0.1
MOMENTUM = 0.9


@pytest.fixture(scope="module")
def local_ray():
    with local_ray_session():
        yield


def trainer(train_loop, storage, name, config=None, max_failures=0):
    return DataParallelTrainer(
        train_loop, train_loop_config=config, backend_config=HvdplusConfig(timeout_s=60),
        scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(storage), failure_config=FailureConfig(max_failures)))


# -- the placeholder rank, without Ray ---------------------------------------------------------

def start_placeholder(folder, owner_pid):
    env = dict(os.environ, **{PROXY_DIR_ENV: folder, OWNER_ENV: str(owner_pid), "PMIX_RANK": "3",
                              "OMPI_COMM_WORLD_SIZE": "4", "UNRELATED_VARIABLE": "x"})
    return subprocess.Popen([sys.executable, "-m", "hvdplus.ray.placeholder"], env=env)


def wait_for(path, timeout_s=10):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.02)


@pytest.mark.timeout(30)
def test_placeholder_hands_over_the_rank_variables_and_waits_for_its_owner(tmp_path):
    import json

    released = tempfile.mkdtemp(dir=tmp_path)
    placeholder = start_placeholder(released, os.getpid())
    wait_for(os.path.join(released, ENVIRONMENT_FILE))
    with open(os.path.join(released, ENVIRONMENT_FILE)) as file:
        variables = json.load(file)
    assert variables["PMIX_RANK"] == "3" and variables["OMPI_COMM_WORLD_SIZE"] == "4"
    assert "UNRELATED_VARIABLE" not in variables and "PATH" not in variables
    open(os.path.join(released, DONE_FILE), "w").close()
    assert placeholder.wait(timeout=10) == 0
    assert not os.path.exists(released)

    # An owner that ends without releasing its placeholder ends it with status 1.
    abandoned = tempfile.mkdtemp(dir=tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    placeholder = start_placeholder(abandoned, owner.pid)
    owner.wait()
    assert placeholder.wait(timeout=10) == 1


# -- training through Ray Train ------------------------------------------------------------------

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data():
    generator = np.random.default_rng(5)
    rows = WORKERS * ROWS_PER_WORKER
    return generator.standard_normal((rows, 6)), generator.standard_normal((rows, 1))


def reference_weights(epochs):
    """One process stepping on the whole batch: the mean of the workers' shard gradients."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    x, y = (torch.tensor(array, dtype=torch.float32) for array in data())
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return net.state_dict()


def train_loop(config):
    """Each worker steps on its own shard of the batch, from the run's last checkpoint. Before
    it ever resumed, rank 1 fails at epoch `fail_at_epoch` (when given) while rank 0 waits for
    its gradients."""
    import ray.train

    import hvdplus.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    context = ray.train.get_context()
    net = config["model"]()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM),
                                         named_parameters=net.named_parameters())
    first_epoch = example.restore(net, optimizer, hvd)
    ranks = hvd.allgather_object([hvd.rank(), hvd.size(), context.get_world_rank(), context.get_world_size()])
    rank_sum = int(hvd.allreduce(torch.tensor([hvd.rank()]), op=hvd.Sum)[0])
    rows = slice(hvd.rank() * ROWS_PER_WORKER, (hvd.rank() + 1) * ROWS_PER_WORKER)
    x, y = (torch.tensor(array[rows], dtype=torch.float32) for array in config["data"])
    for epoch in range(first_epoch, config["epochs"]):
        if epoch == config.get("fail_at_epoch") and first_epoch == 0 and hvd.rank() == 1:
            raise RuntimeError("rank 1 fails before the run resumes")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        metrics = {"epoch": epoch + 1, "first_epoch": first_epoch, "loss": loss.item(), "ranks": ranks,
                   "rank_sum": rank_sum}
        example.report(metrics, net, optimizer, hvd)


def checkpointed_weights(result):
    with result.checkpoint.as_directory() as folder:
        return torch.load(os.path.join(folder, "state.pt"))["model"]


def assert_same_weights(mine, theirs):
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(240)  # 95 s beside the suite's other worker; 140 s on a busier machine
def test_workers_train_as_one_process_and_resume_from_their_checkpoint_after_a_failure(local_ray, tmp_path):
    config = {"model": model, "data": data(), "epochs": 3, "fail_at_epoch": 2}
    result = trainer(train_loop, tmp_path, "resumed", config, max_failures=1).fit()

    assert result.error is None
    assert result.metrics["epoch"] == 3
    # The failure ended the first MPI job; the workers Ray Train started again formed a new
    # one, and it went on from a checkpoint of the first.
    assert result.metrics["first_epoch"] in (1, 2)
    # hvd's rank and size are Ray Train's world rank and size on every worker.
    assert result.metrics["ranks"] == [[rank, WORKERS, rank, WORKERS] for rank in range(WORKERS)]
    assert result.metrics["rank_sum"] == np.sum(np.arange(WORKERS))
    assert_same_weights(checkpointed_weights(result), reference_weights(3))


def fail_on_rank_1(config):
    import numpy as np

    import hvdplus as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("boom on rank 1")
    hvd.allreduce(np.ones(3), name="never_completed")


@pytest.mark.timeout(90)
def test_a_rank_that_raises_fails_the_run_with_its_error(local_ray, tmp_path):
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as raised:
        trainer(fail_on_rank_1, tmp_path, "failing").fit()
    timing.assert_took_under(time.monotonic() - started, 60, quiet=19, what="a Ray Train run failing on a raise")
    assert list(raised.value.worker_failures) == [1]
    assert isinstance(raised.value.worker_failures[1], ValueError)
    assert "Rank 1" in str(raised.value) and "boom on rank 1" in str(raised.value)


@pytest.mark.timeout(240)
def test_the_ray_train_example_learns_the_digits(tmp_path):
    # A Ray of its own, as a user's run of the example starts.
    result = subprocess.run([sys.executable, EXAMPLE, "--epochs", "5", "--storage-path", str(tmp_path)],
                            capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = float(result.stdout.split("final test accuracy")[1].split()[0])
    assert accuracy >= 0.9, result.stdout[-3000:]
