"""Every collective × dtype × shape against numpy, on 1, 2 and 3 ranks."""

import importlib
import warnings

import numpy as np
import pytest

import hvdplus as hvd
from hvdplus.engine import arguments

from testkit.rank_data import rank_values

ml_dtypes = pytest.importorskip("ml_dtypes")

FLOATS = ["float16", ml_dtypes.bfloat16, "float32", "float64"]
INTEGERS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
ALL_DTYPES = FLOATS + INTEGERS + ["bool"]
SHAPES = [(), (0,), (1,), (7,), (3, 4, 5)]
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}

NUMPY_REDUCTIONS = {
    hvd.Sum: lambda stack: stack.sum(axis=0),
    hvd.Average: lambda stack: stack.mean(axis=0),
    hvd.Min: lambda stack: stack.min(axis=0),
    hvd.Max: lambda stack: stack.max(axis=0),
    hvd.Product: lambda stack: stack.prod(axis=0),
}


def valid_ops(dtype):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return [hvd.Min, hvd.Max, hvd.Product]
    if kind in "iu":
        return [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
    return list(NUMPY_REDUCTIONS)


def reference_reduction(dtype, shape, seed, op, size, pre=1.0, post=1.0, low=-3, high=3):
    dtype = np.dtype(dtype)
    inputs = [rank_values(dtype, shape, r, seed, low, high) for r in range(size)]
    wide = {"f": np.float64, "i": np.int64, "u": np.uint64, "b": np.uint8}
    accumulate = wide["f"] if dtype.name == "bfloat16" else wide[dtype.kind]
    stack = np.stack([x.astype(accumulate) * pre if pre != 1.0 else x.astype(accumulate) for x in inputs])
    result = NUMPY_REDUCTIONS[op](stack)
    if post != 1.0:
        result = result * post
    return inputs, result


def assert_matches(actual, expected, dtype):
    dtype = np.dtype(dtype)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if dtype.kind in "iub":
        np.testing.assert_array_equal(actual, expected.astype(dtype))
    else:
        tol = TOLERANCE[dtype.name]
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


CASES = [(dtype, shape, op) for dtype in ALL_DTYPES for shape in SHAPES for op in valid_ops(dtype)]


@pytest.mark.parametrize("dtype, shape, op", CASES, ids=str)
def test_allreduce_matches_numpy(dtype, shape, op, rank, size):
    # Product grows fast: keep its inputs near one so float16 does not overflow.
    low, high = (0.5, 1.5) if op == hvd.Product and np.dtype(dtype).kind == "f" else (-3, 3)
    inputs, expected = reference_reduction(dtype, shape, 11, op, size, low=low, high=high)
    result = hvd.allreduce(inputs[rank], op=op)
    assert_matches(result, expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_allreduce_scale_factors(dtype, op, rank, size):
    inputs, expected = reference_reduction(dtype, (5, 3), 12, op, size, pre=0.5, post=3.0)
    result = hvd.allreduce(inputs[rank], op=op, prescale_factor=0.5, postscale_factor=3.0)
    assert_matches(result, expected, dtype)


def test_allreduce_leaves_input_untouched_and_accepts_lists(rank, size):
    data = np.full(4, rank + 1.0)
    result = hvd.allreduce(data, op=hvd.Sum)
    np.testing.assert_array_equal(data, np.full(4, rank + 1.0))
    np.testing.assert_array_equal(result, np.full(4, size * (size + 1) / 2))
    np.testing.assert_array_equal(hvd.allreduce([1.0, 2.0], op=hvd.Sum), [size, 2.0 * size])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_results_are_separate_aligned_arrays_that_outlive_the_next_step(dtype, rank, size):
    # Each large enough to come from the output pool (64 KiB and up, float16 too), which starts
    # results on 64-byte boundaries, whether fused or (with a tiny fusion buffer) one by one;
    # float16 is accumulated in float32 and handed back converted.
    counts = (40001, 65623, 50000)
    steps = []
    for step in range(2):
        arrays = [rank_values(dtype, (count,), rank, 7 * step + index) for index, count in enumerate(counts)]
        handles = [hvd.allreduce_async(array, name=f"fused.{dtype}.{index}", op=hvd.Sum)
                   for index, array in enumerate(arrays)]
        steps.append([hvd.synchronize(handle) for handle in handles])
    for step, results in enumerate(steps):  # the first step's results survive the second's
        for index, (count, result) in enumerate(zip(counts, results)):
            expected = sum(rank_values(dtype, (count,), r, 7 * step + index).astype(np.float64) for r in range(size))
            assert result.dtype == np.dtype(dtype) and result.shape == (count,)
            assert result.__array_interface__["data"][0] % 64 == 0
            tolerance = {"rtol": 1e-2, "atol": 2e-2} if dtype == "float16" else {"rtol": 1e-5, "atol": 1e-5}
            np.testing.assert_allclose(result, expected, **tolerance)
    results = steps[0]
    results[0][:] = 0  # separate memory: writing one result leaves the others alone
    assert results[1].any() and results[2].any()


def test_allreduce_non_contiguous_input(rank, size):
    base = rank_values("float64", (6, 4), rank, 13)
    result = hvd.allreduce(base[::2, ::2], op=hvd.Sum)
    expected = sum(rank_values("float64", (6, 4), r, 13)[::2, ::2] for r in range(size))
    np.testing.assert_allclose(result, expected, rtol=1e-12)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 3)], ids=str)
def test_allgather_uneven_first_dimension(dtype, trailing, rank, size):
    # Rank 1 contributes no rows at all: empty pieces must not shift the others.
    rows = [0 if r == 1 else r + 2 for r in range(size)]
    inputs = [rank_values(dtype, (rows[r],) + trailing, r, 21) for r in range(size)]
    result = hvd.allgather(inputs[rank])
    np.testing.assert_array_equal(result, np.concatenate(inputs))
    assert result.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_broadcast_from_every_root(dtype, shape, rank, size):
    for root in range(size):
        mine = rank_values(dtype, shape, rank, 31 + root)
        result = hvd.broadcast(mine, root_rank=root)
        np.testing.assert_array_equal(result, rank_values(dtype, shape, root, 31 + root))
        assert result.dtype == np.dtype(dtype) and result.shape == shape


def random_splits(rank, size, seed):
    rng = np.random.default_rng([seed, rank])
    return rng.integers(0, 4, size=size)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("trailing", [(), (2, 3)], ids=str)
def test_alltoall_with_splits(dtype, trailing, rank, size):
    splits = [random_splits(r, size, 41) for r in range(size)]
    inputs = [rank_values(dtype, (int(splits[r].sum()),) + trailing, r, 42) for r in range(size)]
    received, received_splits = hvd.alltoall(inputs[rank], splits=splits[rank])
    pieces = [np.split(inputs[r], np.cumsum(splits[r])[:-1])[rank] for r in range(size)]
    np.testing.assert_array_equal(received, np.concatenate(pieces))
    np.testing.assert_array_equal(received_splits, [splits[r][rank] for r in range(size)])


def test_alltoall_even_split(rank, size):
    data = np.arange(2 * size) + 100 * rank
    received, received_splits = hvd.alltoall(data)
    expected = np.concatenate([np.arange(2 * size)[2 * rank:2 * rank + 2] + 100 * r for r in range(size)])
    np.testing.assert_array_equal(received, expected)
    np.testing.assert_array_equal(received_splits, [2] * size)


def rows_for(rank, first_dim, size):
    base, extra = divmod(first_dim, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "uint8"], ids=str)
@pytest.mark.parametrize("first_dim", [0, 1, 2, 3, 7, 10])
def test_reducescatter_matches_numpy(dtype, first_dim, rank, size):
    for op in valid_ops(dtype):
        low, high = (0.5, 1.5) if op == hvd.Product and np.dtype(dtype).kind == "f" else (-3, 3)
        inputs, expected = reference_reduction(dtype, (first_dim, 2), 51, op, size, low=low, high=high)
        result = hvd.reducescatter(inputs[rank], op=op)
        assert_matches(result, expected[rows_for(rank, first_dim, size)], dtype)


@pytest.mark.parametrize("dtype", ["float16", ml_dtypes.bfloat16, "float32", "float64", "int32", "uint8"], ids=str)
def test_reduce_to_every_root_matches_numpy(dtype, rank, size):
    for root in range(size):
        for op in valid_ops(dtype):
            low, high = (0.5, 1.5) if op == hvd.Product and np.dtype(dtype).kind == "f" else (-3, 3)
            inputs, expected = reference_reduction(dtype, (4, 3), 61 + root, op, size, pre=1.0, low=low, high=high)
            mine = inputs[rank].copy()
            result = hvd.reduce(mine, root_rank=root, op=op)
            if rank == root:
                assert_matches(result, expected, dtype)
            else:  # the others get their own array back, untouched
                assert result is mine
                np.testing.assert_array_equal(mine, inputs[rank])
    inputs, expected = reference_reduction("float32", (5,), 69, hvd.Average, size, pre=0.5, post=3.0)
    handle = hvd.reduce_async(inputs[rank], root_rank=size - 1, op=hvd.Average, prescale_factor=0.5,
                              postscale_factor=3.0)
    if rank == size - 1:
        assert_matches(hvd.synchronize(handle), expected, "float32")


def test_reduce_with_mismatched_roots_or_a_bad_root_raises_on_every_rank(rank, size):
    with pytest.raises(ValueError, match=rf"reduce 'bad_root': root_rank {size} is out of range"):
        hvd.reduce(np.ones(2), root_rank=size if rank == 0 else 0, name="bad_root")
    if size > 1:
        with pytest.raises(hvd.TensorMismatchError, match=r"Mismatched root ranks for 'roots' \(reduce\)"):
            hvd.reduce(np.ones(2), root_rank=rank % 2, name="roots")
    with pytest.raises(ValueError, match="op Adasum combines whole tensors; only allreduce takes it"):
        hvd.reduce(np.ones(2), op=hvd.Adasum, name="adasum_reduce")
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, size))


def test_barrier_and_objects(rank, size):
    hvd.barrier()
    for root in range(size):
        received = hvd.broadcast_object({"from": rank, "payload": [rank] * 3}, root_rank=root)
        assert received == {"from": root, "payload": [root] * 3}
    assert hvd.allgather_object(("rank", rank)) == [("rank", r) for r in range(size)]


def test_large_allreduce(rank, size):
    # 64 MiB of float32: larger than any eager or internal buffer limit of the MPI library.
    data = np.full(16 * 1024 * 1024, rank + 1, dtype=np.float32)
    result = hvd.allreduce(data, op=hvd.Sum)
    assert result[0] == result[-1] == size * (size + 1) / 2


def test_broadcast_object_reaches_ranks_that_passed_none(rank, size):
    # Non-root ranks usually have nothing to pass; they must still receive the root's object.
    received = hvd.broadcast_object({"config": [1, 2]} if rank == 0 else None, root_rank=0)
    assert received == {"config": [1, 2]}


def horovod_integer_reduction(every, dtype, average, prescale=1.0, postscale=1.0):
    """What Horovod computes for integers: each rank's values times `prescale`, truncated
    toward zero; their exact sum; that times `postscale` (over size for Average), truncated."""
    summed = np.sum([np.trunc(prescale * values) for values in every], axis=0)
    return np.trunc(summed * (postscale / len(every) if average else postscale)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_integer_average_and_scale_factors_truncate_as_horovod_does(dtype, rank, size):
    sign = 1 if np.dtype(dtype).kind == "u" else -1
    every = [np.array([2 * r + 1, sign * (3 * r + 2), 5, 0, 7 * r]) for r in range(size)]
    mine = every[rank].astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an integer Average warns once per process
        np.testing.assert_array_equal(hvd.allreduce(mine, op=hvd.Average, name=f"int.avg.{dtype.__name__}"),
                                      horovod_integer_reduction(every, dtype, average=True))
        grouped = hvd.grouped_allreduce([mine, mine[:2]], op=hvd.Average, name=f"int.group.{dtype.__name__}")
    want = horovod_integer_reduction(every, dtype, average=True)
    np.testing.assert_array_equal(grouped[0], want)
    np.testing.assert_array_equal(grouped[1], want[:2])
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=1.5,
                           name=f"int.scaled.{dtype.__name__}")
    np.testing.assert_array_equal(scaled, horovod_integer_reduction(every, dtype, False, 0.5, 1.5))


def test_an_integer_average_warns_and_never_raises():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.reload(arguments)  # forget an earlier test's warning
        hvd.allreduce(np.arange(3, dtype=np.int32), op=hvd.Average, name="int.warns")
    assert any("op Average on integer dtype int32 truncates" in str(w.message) for w in caught)


def adasum_reference(a, b):
    """Horovod's Adasum of two vectors, written out in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adasum_matches_the_formula_on_power_of_two_ranks(dtype, rank, size):
    vectors = [rank_values("float64", (3, 5), r, 31) for r in range(size)]
    if size & (size - 1):
        with pytest.raises(NotImplementedError, match=f"Adasum needs a power-of-two number of ranks, not {size}"):
            hvd.allreduce(vectors[rank].astype(dtype), op=hvd.Adasum, name=f"adasum.{dtype}")
        return
    level = [v.reshape(-1) for v in vectors]
    while len(level) > 1:
        level = [adasum_reference(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    result = hvd.allreduce(vectors[rank].astype(dtype), op=hvd.Adasum, name=f"adasum.{dtype}")
    assert result.dtype == dtype and result.shape == (3, 5)
    np.testing.assert_allclose(result.reshape(-1), level[0], rtol=1e-5, atol=1e-6)
    grouped = hvd.grouped_allreduce([vectors[rank].astype(dtype)] * 2, op=hvd.Adasum, name=f"adasum.group.{dtype}")
    np.testing.assert_allclose(grouped[1].reshape(-1), level[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, scale", [("float32", 1e-30), ("float64", 1e-300), ("float16", 1e-4)])
def test_adasum_of_nearly_parallel_vectors_near_the_smallest_normal(dtype, scale, rank, size):
    # Vectors of norm scale / 2: their squared norms are below float64's smallest number
    # (1e-300), or below 1e-8, under which Horovod leaves a coefficient at 1 (their sum
    # instead of about their mean). The reference scales them to 1, where the formula holds.
    direction = rank_values("float64", (16,), 0, 41)
    vectors = []
    for r in range(size):
        vector = direction + 0.01 * rank_values("float64", (16,), r, 43)
        vectors.append((vector * (scale / 2 / np.linalg.norm(vector))).astype(dtype))
    if size & (size - 1):
        with pytest.raises(NotImplementedError, match="Adasum needs a power-of-two number of ranks"):
            hvd.allreduce(vectors[rank], op=hvd.Adasum, name=f"adasum.tiny.{dtype}")
        return
    level = [v.astype(np.float64) / scale for v in vectors]
    while len(level) > 1:
        level = [adasum_reference(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    result = hvd.allreduce(vectors[rank], op=hvd.Adasum, name=f"adasum.tiny.{dtype}")
    assert result.dtype == dtype
    eps = np.finfo(dtype).eps
    # float16 holds elements this small as subnormals, exact to its smallest step only.
    atol = max(np.finfo(dtype).smallest_subnormal, eps * scale * 1e-3)
    np.testing.assert_allclose(result.astype(np.float64), level[0] * scale, rtol=4 * eps, atol=atol)
