"""The examples run under the launcher and give the same model whatever the rank count."""

import re
import sys

import pytest

pytest.importorskip("sklearn")
pytestmark = pytest.mark.mpi


def final_line(mpi_job, nranks):
    result = mpi_job(nranks, [sys.executable, "examples/numpy_logistic_regression.py", "--steps", "120"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"ranks (\d+)  final loss ([\d.]+)  test accuracy ([\d.]+)", result.stdout)
    assert match, result.stdout
    return int(match.group(1)), float(match.group(2)), float(match.group(3))


@pytest.mark.timeout(300)
def test_logistic_regression_is_the_same_model_on_one_two_and_three_ranks(mpi_job):
    single = final_line(mpi_job, 1)
    assert single[0] == 1 and single[2] > 0.9
    for nranks in (2, 3):
        ranks, loss, accuracy = final_line(mpi_job, nranks)
        assert ranks == nranks
        # Summed gradients over shards are the full-batch gradient: only rounding differs.
        assert loss == pytest.approx(single[1], rel=1e-6)
        assert accuracy == pytest.approx(single[2], abs=1e-9)


def load_balance_run(mpi_job, nranks):
    result = mpi_job(nranks, [sys.executable, "examples/pytorch_load_balance.py", "--epochs", "2", "--slow-rank", "1"],
                     timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    shares = [[int(size) for size in found.split(",")] for found in re.findall(r"shares \[([\d, ]+)\]", result.stdout)]
    match = re.search(r"ranks (\d+)  final loss ([\d.]+)  accuracy ([\d.]+)", result.stdout)
    assert match and shares, result.stdout
    return shares, float(match.group(2))


@pytest.mark.timeout(300)
def test_the_load_balance_example_trains_one_process_model_with_a_smaller_share_for_its_slow_rank(mpi_job):
    pytest.importorskip("torch")
    one_rank_shares, loss = load_balance_run(mpi_job, 1)
    alone = one_rank_shares[-1]
    shares, balanced_loss = load_balance_run(mpi_job, 2)
    assert alone == [128]
    # Weighted by their counts, the shares' gradients are the global batch's: the same steps.
    assert balanced_loss == pytest.approx(loss, rel=1e-5)
    # Rank 1 computes every pass twice: after the first epoch its share is below half.
    assert all(sum(sizes) == 128 and sizes[1] < 64 for sizes in shares), shares
