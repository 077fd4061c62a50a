"""Bad input on any rank raises the same clear error on every rank, and the job goes on."""

import numpy as np
import pytest

import hvdplus as hvd

pytestmark = pytest.mark.skipif(hvd.size() < 2, reason="cross-rank mismatches need two ranks")


@pytest.fixture(autouse=True)
def job_still_works_afterwards(size):
    yield
    np.testing.assert_array_equal(hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, size))


def test_mismatched_shapes_name_tensor_ranks_and_shapes(rank):
    with pytest.raises(hvd.TensorMismatchError) as info:
        hvd.allreduce(np.zeros((17 + rank, 17)), name="grad/fc1.weight")
    message = str(info.value)
    assert "Mismatched shapes for 'grad/fc1.weight'" in message
    assert "rank 0 had (17, 17)" in message and "rank 1 had (18, 17)" in message


def test_mismatched_dtypes(rank):
    dtype = np.float32 if rank == 0 else np.float64
    mismatch = r"dtypes for 'w'.*rank 0 had float32.*ranks? 1(, 2)?(, 3)? had float64"
    with pytest.raises(hvd.TensorMismatchError, match=mismatch):
        hvd.allreduce(np.zeros(3, dtype=dtype), name="w")


def test_mismatched_reduce_ops(rank):
    op = hvd.Sum if rank == 0 else hvd.Max
    with pytest.raises(hvd.TensorMismatchError, match=r"reduce ops.*rank 0 had Sum.*had Max"):
        hvd.allreduce(np.zeros(3), op=op)


def test_mismatched_scale_factors(rank):
    with pytest.raises(hvd.TensorMismatchError, match="prescale factors"):
        hvd.allreduce(np.zeros(3), prescale_factor=1.0 + rank)


def test_mismatched_root_ranks(rank):
    with pytest.raises(hvd.TensorMismatchError, match=r"root ranks.*rank 0 had 0.*ranks? 1(, 2)?(, 3)? had 1"):
        hvd.broadcast(np.zeros(2), root_rank=min(rank, 1))


def test_mismatched_trailing_dimensions_in_allgather(rank):
    mismatch = r"trailing dimensions.*rank 0 had \(2,\).*ranks? 1(, 2)?(, 3)? had \(3,\)"
    with pytest.raises(hvd.TensorMismatchError, match=mismatch):
        hvd.allgather(np.zeros((1, 2 + min(rank, 1))))


def test_mismatched_collective_types(rank):
    mismatch = r"rank 0 had allreduce 'x', ranks? 1(, 2)?(, 3)? had allgather 'x'"
    with pytest.raises(hvd.TensorMismatchError, match=mismatch):
        if rank == 0:
            hvd.allreduce(np.zeros(2), name="x")
        else:
            hvd.allgather(np.zeros(2), name="x")


def test_root_rank_out_of_range_on_one_rank(rank, size):
    with pytest.raises(ValueError, match=rf"rank 1: broadcast .*root_rank {size} is out of range"):
        hvd.broadcast(np.zeros(2), root_rank=size if rank == 1 else 0)


def test_alltoall_splits_with_wrong_sum_or_length(rank, size):
    with pytest.raises(ValueError, match=r"rank 1: alltoall .*sum to"):
        hvd.alltoall(np.zeros(size), splits=[2] * size if rank == 1 else [1] * size)
    with pytest.raises(ValueError, match=r"rank 0: alltoall .*splits has 1 entries"):
        hvd.alltoall(np.zeros(size), splits=[size] if rank == 0 else [1] * size)


def test_unsupported_dtype_on_one_rank(rank):
    dtype = np.complex64 if rank == 1 else np.float32
    with pytest.raises(TypeError, match="rank 1: allreduce .*unsupported dtype complex64"):
        hvd.allreduce(np.zeros(2, dtype=dtype))


def test_sum_of_bools_is_refused_everywhere():
    with pytest.raises(TypeError, match="not defined for bool"):
        hvd.allreduce(np.zeros(2, dtype=bool), op=hvd.Sum)


def test_scalar_allgather_is_refused_everywhere():
    with pytest.raises(ValueError, match="is a scalar"):
        hvd.allgather(np.float32(1.0))
