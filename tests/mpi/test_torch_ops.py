"""hvdplus.torch collectives on real tensors against numpy/torch references, autograd, errors."""

import warnings

import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.rank_data import rank_values  # noqa: E402

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTEGERS = [torch.int8, torch.int32, torch.int64, torch.uint8]
TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def rank_tensor(dtype, shape, rank, seed):
    if dtype == torch.bool:
        return torch.from_numpy(rank_values("bool", shape, rank, seed))
    if dtype.is_floating_point:
        return torch.from_numpy(rank_values("float64", shape, rank, seed)).to(dtype)
    return torch.from_numpy(rank_values(str(dtype).replace("torch.", ""), shape, rank, seed))


def reference(dtype, shape, seed, size, reduce):
    stack = torch.stack([rank_tensor(dtype, shape, r, seed).to(torch.float64) for r in range(size)])
    return reduce(stack)


def assert_close(actual, expected, dtype):
    assert actual.dtype == dtype
    if dtype.is_floating_point:
        torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), rtol=TOL[dtype],
                                   atol=TOL[dtype])
    else:
        assert torch.equal(actual, expected.to(dtype))


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS, ids=str)
@pytest.mark.parametrize("variant", ["sync", "async", "in_place", "async_in_place"])
def test_allreduce_variants(dtype, variant, rank, size):
    op = hvd.Average if dtype.is_floating_point else hvd.Sum
    mine = rank_tensor(dtype, (4, 3), rank, 1)
    want = reference(dtype, (4, 3), 1, size, lambda s: s.mean(0) if op == hvd.Average else s.sum(0))
    if variant == "sync":
        result = hvd.allreduce(mine, op=op, name="t.ar")
    elif variant == "async":
        result = hvd.synchronize(hvd.allreduce_async(mine, op=op, name="t.ar"))
    elif variant == "in_place":
        result = hvd.allreduce_(mine, op=op, name="t.ar")
        assert result is mine
    else:
        handle = hvd.allreduce_async_(mine, op=op, name="t.ar")
        result = hvd.synchronize(handle)
        assert result is mine and hvd.poll(handle)
    assert_close(result, want, dtype)


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product])
def test_other_ops_and_bool(op, rank, size):
    mine = rank_tensor(torch.float32, (5,), rank, 2)
    reduce = {hvd.Min: lambda s: s.min(0).values, hvd.Max: lambda s: s.max(0).values,
              hvd.Product: lambda s: s.prod(0)}[op]
    assert_close(hvd.allreduce(mine, op=op), reference(torch.float32, (5,), 2, size, reduce), torch.float32)
    flags = rank_tensor(torch.bool, (6,), rank, 3)
    everyone = torch.stack([rank_tensor(torch.bool, (6,), r, 3) for r in range(size)])
    assert torch.equal(hvd.allreduce(flags, op=hvd.Max), everyone.any(0))


def test_legacy_average_flag_and_scaling(rank, size):
    ones = torch.ones(3)
    assert torch.equal(hvd.allreduce(ones, average=False), torch.full((3,), float(size)))
    assert torch.allclose(hvd.allreduce(ones, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
                          torch.full((3,), float(size)))


def test_grouped_allreduce(rank, size):
    tensors = [torch.full((2,), float(rank)), torch.full((3, 3), rank + 1.0, dtype=torch.float64)]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert torch.equal(results[0], torch.full((2,), size * (size - 1) / 2))
    assert torch.equal(results[1], torch.full((3, 3), size * (size + 1) / 2, dtype=torch.float64))
    hvd.grouped_allreduce_(tensors, op=hvd.Sum)
    assert torch.equal(tensors[0], results[0])
    handle = hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Sum)
    assert torch.equal(hvd.synchronize(handle)[0], torch.full((2,), float(size)))


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool], ids=str)
def test_allgather_uneven(dtype, rank, size):
    pieces = [rank_tensor(dtype, (r + 1, 2), r, 4) for r in range(size)]
    assert torch.equal(hvd.allgather(pieces[rank]), torch.cat(pieces))
    grouped = hvd.grouped_allgather([pieces[rank], pieces[rank][:1]])
    assert torch.equal(grouped[1], torch.cat([p[:1] for p in pieces]))


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool], ids=str)
def test_broadcast_and_in_place(dtype, rank, size):
    root = size - 1
    mine = rank_tensor(dtype, (3, 2), rank, 5)
    theirs = rank_tensor(dtype, (3, 2), root, 5)
    assert torch.equal(hvd.broadcast(mine, root_rank=root), theirs)
    assert hvd.broadcast_(mine, root_rank=root) is mine and torch.equal(mine, theirs)


def test_alltoall_and_reducescatter(rank, size):
    splits = [r + 1 for r in range(size)]
    data = torch.arange(sum(splits), dtype=torch.float32) + 100 * rank
    received, received_splits = hvd.alltoall(data, splits=torch.tensor(splits))
    offset = sum(splits[:rank])
    expected = torch.cat([torch.arange(offset, offset + splits[rank], dtype=torch.float32) + 100 * r
                          for r in range(size)])
    assert torch.equal(received, expected)
    assert received_splits.tolist() == [splits[rank]] * size
    # Without splits, Horovod returns the received rows alone.
    even = hvd.alltoall(torch.full((size, 2), float(rank)))
    assert torch.equal(even, torch.arange(size, dtype=torch.float32).repeat_interleave(2).reshape(size, 2))
    rows = torch.ones(2 * size + 1, 4)
    mine = hvd.reducescatter(rows, op=hvd.Sum)
    assert mine.shape == (3 if rank == 0 else 2, 4) and torch.all(mine == size)


def test_reduce_to_a_root(rank, size):
    root = size - 1
    mine = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    result = hvd.reduce(mine, root_rank=root, op=hvd.Sum)
    if rank == root:
        torch.testing.assert_close(result, torch.arange(6, dtype=torch.float32).reshape(2, 3) * sum(range(1, size + 1)))
        assert result.data_ptr() != mine.data_ptr()
    else:
        assert result is mine
    average = hvd.synchronize(hvd.reduce_async(torch.full((4,), float(rank), dtype=torch.float64), root_rank=0))
    if rank == 0:
        torch.testing.assert_close(average, torch.full((4,), (size - 1) / 2, dtype=torch.float64))


def test_autograd_through_allreduce_allgather_broadcast(rank, size):
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    weights = torch.arange(3, dtype=torch.float32) + rank
    (hvd.allreduce(x, op=hvd.Average) * weights).sum().backward()
    # d/dx_r of sum over ranks' losses: the average of every rank's weights.
    everyone = torch.stack([torch.arange(3, dtype=torch.float32) + r for r in range(size)])
    assert torch.allclose(x.grad, everyone.mean(0))

    # As in Horovod, allgather's and broadcast's gradients average the ranks' incoming
    # gradients (each rank's loss is its share of one mean): here the mean of r + 1.
    y = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    gathered = hvd.allgather(y)
    (gathered * (rank + 1)).sum().backward()
    assert torch.allclose(y.grad, torch.full((rank + 1, 2), (size + 1) / 2))

    z = torch.full((2,), float(rank), requires_grad=True)
    (hvd.broadcast(z, root_rank=0) * (rank + 1)).sum().backward()
    expected = (size + 1) / 2 if rank == 0 else 0.0
    assert torch.allclose(z.grad, torch.full((2,), expected))


def test_autograd_through_alltoall(rank, size):
    # Rank r sends r + 1 rows to every rank and weighs what it receives from rank q by
    # (r + 1) * (q + 1): the gradient of a row sent to rank d is (d + 1) * (r + 1).
    x = torch.zeros((size * (rank + 1), 3), requires_grad=True)
    received, received_splits = hvd.alltoall(x, splits=[rank + 1] * size)
    assert received_splits.tolist() == [q + 1 for q in range(size)]
    weights = torch.cat([torch.full((q + 1, 3), float((rank + 1) * (q + 1))) for q in range(size)])
    (received * weights).sum().backward()
    expected = torch.cat([torch.full((rank + 1, 3), float((d + 1) * (rank + 1))) for d in range(size)])
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_average_and_scale_factors_truncate_as_horovod_does(dtype, rank, size):
    every = [torch.tensor([2 * r + 1, -(3 * r + 2), 5, 7 * r], dtype=torch.float64) for r in range(size)]
    mine = every[rank].to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an integer Average warns once per process
        averaged = hvd.allreduce(mine)  # Average, Horovod's default
    assert averaged.dtype == dtype
    assert torch.equal(averaged, torch.trunc(torch.stack(every).sum(0) / size).to(dtype))
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.equal(scaled, torch.trunc(3.0 * torch.stack([torch.trunc(0.5 * e) for e in every]).sum(0)).to(dtype))


def test_fp16_compression_within_tolerance(rank, size):
    values = torch.linspace(-3, 3, 50) * (rank + 1)
    result = hvd.allreduce(values, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert result.dtype == torch.float32
    assert torch.allclose(result, torch.linspace(-3, 3, 50) * size * (size + 1) / 2, rtol=2e-3, atol=2e-3)


needs_two = pytest.mark.skipif(hvd.size() < 2, reason="errors on one rank need two ranks")


@needs_two
def test_non_contiguous_on_one_rank_fails_everywhere(rank):
    tensor = torch.ones(4, 4).t() if rank == 1 else torch.ones(4, 4)
    with pytest.raises(ValueError, match="rank 1: allreduce 'nc': tensor is not contiguous"):
        hvd.allreduce(tensor, name="nc")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(hvd.size())))


@needs_two
def test_bad_tensor_in_a_group_on_one_rank_fails_everywhere(rank):
    tensors = [torch.ones(3), torch.ones(4, 4).t() if rank == 1 else torch.ones(4, 4)]
    with pytest.raises(ValueError, match="rank 1: grouped_allreduce 'g': tensor is not contiguous"):
        hvd.grouped_allreduce(tensors, name="g")
    assert torch.equal(hvd.grouped_allreduce([torch.ones(2)], op=hvd.Sum)[0], torch.full((2,), float(hvd.size())))


@needs_two
def test_group_members_the_quick_conversion_refuses_get_their_own_errors(rank):
    """A group of plain CPU tensors is converted in one pass (buffers.numpy_views); any other
    member sends the whole group through the per-tensor checks, whose errors name it."""
    leaf = torch.ones(3, requires_grad=rank == 1)
    with pytest.raises(ValueError, match="rank 1: grouped_allreduce 'leaf': an in-place collective would "
                                         "overwrite a leaf tensor that requires grad"):
        hvd.grouped_allreduce_([torch.ones(2), leaf], name="leaf")
    odd = torch.ones(2, dtype=torch.complex64 if rank == 1 else torch.float32)
    with pytest.raises(ValueError, match="rank 1: grouped_allreduce 'cplx': unsupported dtype torch.complex64"):
        hvd.grouped_allreduce_([torch.ones(2), odd], name="cplx")
    mixed = [torch.full((4,), rank + 1.0, dtype=torch.bfloat16), torch.full((2, 2), float(rank))]
    hvd.grouped_allreduce_(mixed, op=hvd.Sum, name="mixed")
    size = hvd.size()
    assert torch.equal(mixed[0], torch.full((4,), size * (size + 1) / 2, dtype=torch.bfloat16))
    assert torch.equal(mixed[1], torch.full((2, 2), size * (size - 1) / 2))


def test_unsupported_dtype_and_grad_leaf_in_place(rank):
    with pytest.raises(ValueError, match="unsupported dtype torch.complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="cplx")
    leaf = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        hvd.allreduce_(leaf, name="leaf")


@needs_two
def test_mismatched_shapes_raise_everywhere(rank):
    with pytest.raises(hvd.TensorMismatchError, match="Mismatched shapes for 'grad/fc1.weight'"):
        hvd.allreduce(torch.zeros(17 + rank, 17), name="grad/fc1.weight")


def test_objects_and_runtime_queries(rank, size):
    assert hvd.broadcast_object({"x": torch.ones(2) * rank}, root_rank=0)["x"].sum() == 0
    assert hvd.allgather_object(rank) == list(range(size))
    assert (hvd.rank(), hvd.size()) == (rank, size)
    hvd.barrier()


def test_grouped_reducescatter_matches_each_reducescatter(rank, size):
    tensors = [torch.full((2 * size + 1, 3), float(rank + 1)), torch.arange(size * 2.0).reshape(size, 2) * (rank + 1)]
    scattered = hvd.grouped_reducescatter(tensors, op=hvd.Sum, name="grouped.rs")
    total = size * (size + 1) / 2
    assert scattered[0].shape == (3 if rank == 0 else 2, 3) and torch.all(scattered[0] == total)
    assert torch.equal(scattered[1], torch.arange(size * 2.0).reshape(size, 2)[rank:rank + 1] * total)
    averaged = hvd.synchronize(hvd.grouped_reducescatter_async(tensors[:1], name="grouped.rs.avg"))
    assert torch.allclose(averaged[0], torch.full_like(averaged[0], total / size))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_sparse_allreduce_async_matches_the_dense_reduction(op, rank, size):
    dense = torch.zeros(6, 3)
    dense[rank % 6] = rank + 1.0
    dense[5] = 2.0  # every rank has a row 5: gathered duplicates add up
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op}", op=op)
    reduced = hvd.synchronize(handle)
    assert reduced.is_sparse
    want = sum(torch.zeros(6, 3).index_fill_(0, torch.tensor([r % 6]), r + 1.0) for r in range(size))
    want[5] += 2.0 * size
    if op == hvd.Average:
        want /= size
    assert torch.allclose(reduced.to_dense(), want)


def test_join_takes_horovods_device_argument(rank, size):
    def join_last(last):
        # The last rank all-reduces before joining: that completes only once every other
        # rank's join has reached the coordinator (joined ranks add zeros), so it joins last.
        if rank == last:
            assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"before.join.{last}"), torch.ones(2))
        return hvd.join(device=-1) if last else hvd.join(-1)

    assert join_last(size - 1) == size - 1
    assert join_last(0) == 0
