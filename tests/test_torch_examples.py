"""The PyTorch examples run on 2 ranks under the launcher: the digits CNN learns, only rank 0
prints and checkpoints, and the synthetic benchmark reports the job's throughput."""

import re
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")
pytestmark = pytest.mark.mpi


def output_of(result):
    return f"--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"


@pytest.mark.timeout(150)
def test_digits_learns_on_2_ranks_and_only_rank_0_logs_and_checkpoints(mpi_job, tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    result = mpi_job(2, [sys.executable, "examples/pytorch_digits.py", "--checkpoint", str(checkpoint)],
                     timeout=120)
    assert result.returncode == 0, output_of(result)

    finals = re.findall(r"final test accuracy ([\d.]+)", result.stdout)
    assert len(finals) == 1, output_of(result)
    assert float(finals[0]) > 0.9, output_of(result)
    # The launcher tags every line with its rank: "[1,0]<stdout>:" under Open MPI, "[0]" elsewhere.
    metric_lines = [line for line in result.stdout.splitlines() if "test accuracy" in line]
    assert len(metric_lines) == 5 + 1, output_of(result)  # one per epoch, then the final line
    assert all(re.match(r"\[(\d+,)?0\]", line) for line in metric_lines), output_of(result)
    rank_1_lines = re.findall(r"^\[(?:\d+,)?1\].*\S.*$", result.stdout + result.stderr, re.MULTILINE)
    assert not rank_1_lines, "rank 1 printed (logs and progress bar belong to rank 0):\n" + "\n".join(rank_1_lines)

    state = torch.load(checkpoint, weights_only=True)
    assert state["epoch"] == 5
    assert "fc2.weight" in state["model"]
    assert state["optimizer"]["state"], "the checkpoint holds no Adam moments"


@pytest.mark.timeout(90)
def test_synthetic_benchmark_reports_total_throughput_of_2_ranks(mpi_job):
    args = [sys.executable, "examples/pytorch_synthetic_benchmark.py", "--batch-size", "4", "--image-size", "16",
            "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce"]
    result = mpi_job(2, args, timeout=60)
    assert result.returncode == 0, output_of(result)
    assert len(re.findall(r"Iter #\d+: ", result.stdout)) == 2, output_of(result)
    assert re.search(r"Img/sec per rank: [\d.]+ \+- [\d.]+", result.stdout), output_of(result)
    assert len(re.findall(r"Total img/sec on 2 rank\(s\): [\d.]+ \+- [\d.]+", result.stdout)) == 1, output_of(result)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_hybrid_parallel_example_learns_with_2_stages_times_2_replicas(mpi_job):
    result = mpi_job(4, [sys.executable, "examples/pytorch_hybrid_parallel.py", "--epochs", "4"], timeout=180)
    assert result.returncode == 0, output_of(result)
    accuracies = [float(a) for a in re.findall(r"test accuracy ([\d.]+)", result.stdout)]
    assert len(accuracies) == 4, output_of(result)  # rank 0 alone prints, once per epoch
    assert accuracies[-1] > 0.9, output_of(result)


@pytest.mark.timeout(150)
def test_tensor_parallel_example_learns_and_equals_the_unsplit_model(mpi_job):
    result = mpi_job(2, [sys.executable, "examples/pytorch_tensor_parallel.py", "--epochs", "3"], timeout=120)
    assert result.returncode == 0, output_of(result)
    accuracy = float(re.search(r"test accuracy ([\d.]+)", result.stdout).group(1))
    gap = float(re.search(r"unsplit model trained alone: ([\d.e+-]+)", result.stdout).group(1))
    assert accuracy > 0.9 and gap < 1e-4, output_of(result)
