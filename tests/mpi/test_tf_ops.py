"""hvdplus.tensorflow collectives on real tensors, eagerly and inside tf.function, against
numpy; their gradients; errors raised on every rank. Any number of ranks."""

import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import hvdplus.tensorflow as hvd  # noqa: E402
from testkit.rank_data import rank_values  # noqa: E402
from testkit.tensorflow_modes import MODES, gradient_of, run  # noqa: E402

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
INTEGERS = [tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64]
ALL = FLOATS + INTEGERS + [tf.bool]
TOL = {tf.float16: 1e-2, tf.bfloat16: 3e-2, tf.float32: 1e-5, tf.float64: 1e-12}


def rank_array(dtype, shape, rank, seed):
    """Rank `rank`'s data as a numpy array of `dtype`'s numpy type (ml_dtypes for bfloat16)."""
    if dtype.is_floating:
        return rank_values("float64", shape, rank, seed).astype(dtype.as_numpy_dtype)
    return rank_values(dtype.name, shape, rank, seed)


def rank_tensor(dtype, shape, rank, seed):
    return tf.constant(rank_array(dtype, shape, rank, seed), dtype=dtype)


def everyone(dtype, shape, size, seed):
    """Every rank's data, stacked, in float64 (bool and integers keep their own type)."""
    arrays = [rank_array(dtype, shape, r, seed) for r in range(size)]
    return np.stack([a.astype(np.float64) if dtype.is_floating else a for a in arrays])


def assert_close(actual, expected, dtype):
    assert actual.dtype == dtype
    actual = actual.numpy()
    if dtype.is_floating:
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=TOL[dtype], atol=TOL[dtype])
    else:
        np.testing.assert_array_equal(actual, np.asarray(expected).astype(dtype.as_numpy_dtype))


def default_op(dtype):
    if dtype == tf.bool:
        return hvd.Max
    return hvd.Average if dtype.is_floating else hvd.Sum


REFERENCE = {hvd.Average: lambda s: s.mean(0), hvd.Sum: lambda s: s.sum(0), hvd.Min: lambda s: s.min(0),
             hvd.Max: lambda s: s.max(0), hvd.Product: lambda s: s.prod(0)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_allreduce(dtype, mode, rank, size):
    op = default_op(dtype)
    result = run(mode, lambda x: hvd.allreduce(x, op=op), rank_tensor(dtype, (4, 3), rank, 1))
    assert result.shape == (4, 3)
    assert_close(result, REFERENCE[op](everyone(dtype, (4, 3), size, 1)), dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product], ids=lambda op: op.label)
def test_allreduce_other_ops_and_scaling(op, mode, rank, size):
    mine = rank_tensor(tf.float32, (5,), rank, 2)
    assert_close(run(mode, lambda x: hvd.allreduce(x, op=op), mine),
                 REFERENCE[op](everyone(tf.float32, (5,), size, 2)), tf.float32)
    ones = tf.ones([3])
    scaled = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25), ones)
    assert_close(scaled, np.full(3, size / 2), tf.float32)
    assert_close(run(mode, lambda x: hvd.allreduce(x, average=False), ones), np.full(3, float(size)), tf.float32)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes(mode, rank, size):
    dtypes = [tf.float32, tf.float64, tf.int32, tf.bfloat16]
    tensors = [rank_tensor(dtype, (2, i + 1), rank, 3 + i) for i, dtype in enumerate(dtypes)]
    results = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=hvd.Sum), *tensors)
    for i, (dtype, result) in enumerate(zip(dtypes, results)):
        assert_close(result, everyone(dtype, (2, i + 1), size, 3 + i).sum(0), dtype)


@pytest.mark.parametrize("mode", MODES)
def test_fp16_compression(mode, rank, size):
    values = tf.linspace(-3.0, 3.0, 50) * (rank + 1)
    result = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16), values)
    assert result.dtype == tf.float32
    np.testing.assert_allclose(result.numpy(), np.linspace(-3, 3, 50) * size * (size + 1) / 2, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_allgather_uneven_rows(dtype, mode, rank, size):
    pieces = [rank_array(dtype, (r + 1, 2), r, 4) for r in range(size)]
    gathered = run(mode, hvd.allgather, tf.constant(pieces[rank], dtype=dtype))
    assert gathered.dtype == dtype
    np.testing.assert_array_equal(gathered.numpy(), np.concatenate(pieces))
    first_rows = run(mode, lambda x: hvd.grouped_allgather([x, x[:1]]), tf.constant(pieces[rank], dtype=dtype))
    np.testing.assert_array_equal(first_rows[1].numpy(), np.concatenate([p[:1] for p in pieces]))


def test_allgather_static_shape_in_graph(rank):
    @tf.function
    def gather(x):
        result = hvd.allgather(x)
        assert result.shape.as_list() == [None, 3]
        return result

    assert gather(tf.zeros([rank + 1, 3])).shape[1] == 3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_broadcast(dtype, mode, rank, size):
    root = size - 1
    result = run(mode, lambda x: hvd.broadcast(x, root_rank=root), rank_tensor(dtype, (3, 2), rank, 5))
    np.testing.assert_array_equal(result.numpy(), rank_array(dtype, (3, 2), root, 5))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_alltoall(dtype, mode, rank, size):
    splits = [r + 1 for r in range(size)]
    data = [rank_array(dtype, (sum(splits), 2), r, 6) for r in range(size)]
    offset = sum(splits[:rank])
    expected = np.concatenate([d[offset:offset + splits[rank]] for d in data])
    received, received_splits = run(mode, lambda x, s: hvd.alltoall(x, splits=s),
                                    tf.constant(data[rank], dtype=dtype), tf.constant(splits))
    np.testing.assert_array_equal(received.numpy(), expected)
    assert received_splits.numpy().tolist() == [splits[rank]] * size
    # Without splits, Horovod returns the received rows alone.
    even = run(mode, hvd.alltoall, tf.constant(np.repeat(data[rank][:1], size, axis=0), dtype=dtype))
    np.testing.assert_array_equal(even.numpy(), np.concatenate([d[:1] for d in data]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS, ids=lambda d: d.name)
def test_reducescatter(dtype, mode, rank, size):
    op = default_op(dtype)
    rows = 2 * size + 1
    result = run(mode, lambda x: hvd.reducescatter(x, op=op), rank_tensor(dtype, (rows, 3), rank, 7))
    start = 0 if rank == 0 else 2 * rank + 1
    block = REFERENCE[op](everyone(dtype, (rows, 3), size, 7))[start:start + (3 if rank == 0 else 2)]
    assert_close(result, block, dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.int32], ids=lambda d: d.name)
def test_reduce_to_a_root(dtype, mode, rank, size):
    op = default_op(dtype)
    root = size - 1
    mine = rank_tensor(dtype, (4, 3), rank, 8)
    result = run(mode, lambda x: hvd.reduce(x, root_rank=root, op=op), mine)
    if rank == root:
        assert_close(result, REFERENCE[op](everyone(dtype, (4, 3), size, 8)), dtype)
    else:  # the others get their own tensor back
        assert_close(result, rank_array(dtype, (4, 3), rank, 8).astype(np.float64 if dtype.is_floating else None),
                     dtype)


# -- gradients ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum], ids=lambda op: op.label)
def test_allreduce_gradient_is_an_allreduce(op, mode, rank, size):
    x = tf.Variable(tf.fill([3], float(rank + 1)))
    weights = tf.range(3, dtype=tf.float32) + rank
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.allreduce(x, op=op, prescale_factor=2.0) * weights), x)
    every_weight = np.stack([np.arange(3) + r for r in range(size)])
    expected = 2 * (every_weight.mean(0) if op == hvd.Average else every_weight.sum(0))
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_gradient(mode, rank, size):
    a, b = tf.Variable(tf.ones([2])), tf.Variable(tf.ones([3], tf.float64))

    def loss():
        ra, rb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
        return tf.reduce_sum(ra) * (rank + 1) + tf.cast(tf.reduce_sum(rb), tf.float32)

    grad_a, grad_b = gradient_of(mode, loss, a, b)
    np.testing.assert_allclose(grad_a.numpy(), np.full(2, size * (size + 1) / 2))
    np.testing.assert_allclose(grad_b.numpy(), np.full(3, float(size)))


# Horovod's gradients of allgather and broadcast average the ranks' incoming gradients
# (here the mean of r + 1 is (size + 1) / 2); reducescatter's gathers them, times size for Sum.
@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_is_the_average_of_my_rows(mode, rank, size):
    y = tf.Variable(tf.ones([rank + 1, 2]))
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.allgather(y) * (rank + 1)), y)
    np.testing.assert_allclose(grad.numpy(), np.full((rank + 1, 2), (size + 1) / 2))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_gradient_goes_to_the_root(mode, rank, size):
    z = tf.Variable(tf.fill([2], float(rank)))
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.broadcast(z, root_rank=0) * (rank + 1)), z)
    np.testing.assert_allclose(grad.numpy(), np.full(2, (size + 1) / 2 if rank == 0 else 0.0))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient_returns_rows_to_their_sender(mode, rank, size):
    splits = [r + 1 for r in range(size)]
    x = tf.Variable(tf.ones([sum(splits), 2]))
    # Rank r weights what it received by r + 1, so the rows rank r sent to rank j get j + 1.
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.alltoall(x, splits=splits)[0] * (rank + 1)), x)
    expected = np.concatenate([np.full((s, 2), j + 1.0) for j, s in enumerate(splits)])
    np.testing.assert_allclose(grad.numpy(), expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum], ids=lambda op: op.label)
def test_reducescatter_gradient_is_an_allgather(op, mode, rank, size):
    x = tf.Variable(tf.ones([2 * size, 2]))
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.reducescatter(x, op=op) * (rank + 1)), x)
    per_rank = np.repeat(np.arange(1.0, size + 1), 2)[:, None] * np.ones((1, 2))
    np.testing.assert_allclose(grad.numpy(), per_rank if op == hvd.Average else per_rank * size)


def test_min_has_no_gradient():
    x = tf.Variable(tf.ones([2]))
    with pytest.raises(RuntimeError, match="allreduce with op Min has no gradient"):
        gradient_of("eager", lambda: tf.reduce_sum(hvd.allreduce(x, op=hvd.Min)), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum], ids=lambda op: op.label)
def test_indexed_slices_are_gathered(op, mode, rank, size):
    table = tf.Variable(tf.ones([6, 2]))
    ids = tf.constant([rank % 6, (rank + 1) % 6, 5])
    (grad,) = gradient_of(mode, lambda: tf.reduce_sum(tf.gather(table, ids)) * (rank + 1), table)
    assert isinstance(grad, tf.IndexedSlices)
    def reduce(values, indices):
        return tf.convert_to_tensor(hvd.allreduce(tf.IndexedSlices(values, indices, grad.dense_shape), op=op))

    reduced = run(mode, reduce, grad.values, grad.indices)
    expected = np.zeros((6, 2))
    for r in range(size):
        for row in (r % 6, (r + 1) % 6, 5):
            expected[row] += r + 1
    np.testing.assert_allclose(reduced.numpy(), expected / size if op == hvd.Average else expected, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_integer_indexed_slices_average_to_float64_as_horovod_does(mode, rank, size):
    values, indices = tf.constant([[rank + 1, 2 * rank]], tf.int32), tf.constant([rank % 4])

    def reduce(values, indices):
        reduced = hvd.allreduce(tf.IndexedSlices(values, indices, tf.constant([4, 2], tf.int64)))
        return reduced.values, reduced.indices

    got_values, got_indices = run(mode, reduce, values, indices)
    assert got_values.dtype == tf.float64
    np.testing.assert_allclose(got_values.numpy(), [[(r + 1) / size, 2 * r / size] for r in range(size)])
    np.testing.assert_array_equal(got_indices.numpy(), [r % 4 for r in range(size)])
    # As in Horovod, other ops and scale factors are refused when the call is made or traced.
    for op, scale in [(hvd.Min, 1.0), (hvd.Adasum, 1.0), (hvd.Sum, 2.0)]:
        with pytest.raises(NotImplementedError, match="Adasum" if op == hvd.Adasum else "IndexedSlices"):
            run(mode, lambda v, i: hvd.allreduce(tf.IndexedSlices(v, i, tf.constant([4, 2], tf.int64)), op=op,
                                                 prescale_factor=scale).values, values, indices)


# -- names, variables, objects, join -----------------------------------------------------------
def test_graph_names_do_not_depend_on_how_often_each_rank_retraces(rank):
    """Rank 0 traces the function twice (two shapes), the others once: the collectives of
    the second call still pair up, because a collective's name is its place in the graph."""
    gather = tf.function(hvd.allgather)
    rank_0_rows = [1, 2]
    for call in range(2):
        rows = rank_0_rows[call] if rank == 0 else 3
        assert gather(tf.zeros([rows, 2])).shape[0] == rank_0_rows[call] + 3 * (hvd.size() - 1)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_variables(mode, rank):
    variables = [tf.Variable(tf.fill([2, 2], float(rank))), tf.Variable([rank, 7], dtype=tf.int64)]
    if mode == "eager":
        hvd.broadcast_variables(variables, root_rank=0)
    else:
        tf.function(lambda: hvd.broadcast_variables(variables, root_rank=0))()
    np.testing.assert_array_equal(variables[0].numpy(), np.zeros((2, 2)))
    assert variables[1].numpy().tolist() == [0, 7]


def test_objects_join_barrier_and_queries(rank, size):
    assert hvd.broadcast_object({"x": tf.ones([2]) * rank}, root_rank=0)["x"].numpy().sum() == 0
    assert hvd.allgather_object(rank) == list(range(size))
    assert (hvd.rank(), hvd.size()) == (rank, size)
    hvd.barrier()
    tf.function(hvd.barrier)()
    assert 0 <= int(hvd.join()) < size
    assert 0 <= int(tf.function(hvd.join)()) < size


# -- errors raise on every rank ------------------------------------------------------------------
needs_two = pytest.mark.skipif(hvd.size() < 2, reason="errors on one rank need two ranks")
GRAPH_ERROR = tf.errors.InvalidArgumentError  # what TensorFlow makes of a TypeError or ValueError


@needs_two
@pytest.mark.parametrize("mode", MODES)
def test_mismatched_shapes_raise_everywhere(mode, rank):
    error = hvd.TensorMismatchError if mode == "eager" else tf.errors.FailedPreconditionError
    with pytest.raises(error, match="Mismatched shapes for 'grad/w'"):
        run(mode, lambda x: hvd.allreduce(x, name="grad/w"), tf.zeros([17 + rank, 3]))
    assert_close(run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), tf.ones([2])), np.full(2, hvd.size()), tf.float32)


@needs_two
@pytest.mark.parametrize("mode", MODES)
def test_bad_input_on_one_rank_raises_everywhere(mode, rank):
    value = object() if rank == 1 else tf.ones([2])
    error = TypeError if mode == "eager" else GRAPH_ERROR
    with pytest.raises(error, match="rank 1: allreduce 'bad' needs a tensor, got object"):
        if mode == "eager":
            hvd.allreduce(value, name="bad")
        else:
            tf.function(lambda: hvd.allreduce(value, name="bad"))()
    with pytest.raises(error, match="rank 1: grouped_allreduce 'group' needs a tensor"):
        if mode == "eager":
            hvd.grouped_allreduce([tf.ones([2]), value], name="group")
        else:
            tf.function(lambda: hvd.grouped_allreduce([tf.ones([2]), value], name="group"))()
    assert_close(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, hvd.size()), tf.float32)


@pytest.mark.parametrize("mode", MODES)
def test_average_and_scale_factors_of_integers_truncate_as_horovod_does(mode, rank, size):
    every = np.array([[2 * r + 1, -(3 * r + 2), 7 * r] for r in range(size)], dtype=np.float64)
    mine = tf.constant(every[rank], tf.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an integer Average warns once per process
        assert_close(run(mode, hvd.allreduce, mine), np.trunc(every.sum(0) / size), tf.int32)
    scaled = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), mine)
    assert_close(scaled, np.trunc(3.0 * np.trunc(0.5 * every).sum(0)), tf.int32)


# -- Horovod's graph-mode ops, in-place broadcasts and error classes ------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_query_ops_read_the_job_when_they_run(mode, rank, size):
    values = run(mode, lambda: [hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op(),
                                hvd.process_set_included_op(), hvd.process_set_included_op(99)])
    assert [int(v) for v in values] == [size, rank, hvd.local_size(), hvd.local_rank(), 1, -3]
    assert all(v.dtype == tf.int32 for v in values)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_in_place_and_grouped_reducescatter(mode, rank, size):
    variables = [tf.Variable(tf.fill([2], float(rank))), tf.Variable(tf.fill([3], rank + 10))]
    values = run(mode, lambda: hvd.broadcast_(variables, root_rank=size - 1))
    np.testing.assert_array_equal(values[0].numpy(), [size - 1.0] * 2)
    np.testing.assert_array_equal(variables[1].numpy(), [size + 9] * 3)
    parts = run(mode, lambda: hvd.grouped_reducescatter([tf.ones([size, 2]) * (rank + 1), tf.ones([size])],
                                                        op=hvd.Sum))
    np.testing.assert_array_equal(parts[0].numpy(), np.full((1, 2), size * (size + 1) / 2))
    np.testing.assert_array_equal(parts[1].numpy(), [size])


def in_a_session(build):
    """What `build()` gives, run by a tf.compat.v1 Session in a graph of its own."""
    with tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as session:
            return session.run(fetches)


@needs_two
@pytest.mark.parametrize("mode", ["eager", "graph", "session"])
def test_a_mismatch_is_horovods_failed_precondition_in_every_mode(mode, rank, size):
    shape = [2] if rank == 0 else [3]
    name = f"mismatch.{mode}"
    call = lambda: hvd.allreduce(tf.ones(shape), name=name)  # noqa: E731
    with pytest.raises(tf.errors.FailedPreconditionError, match=f"Mismatched shapes for '{name}'") as caught:
        in_a_session(call) if mode == "session" else run(mode, call)
    others = "rank 1" if size == 2 else "ranks " + ", ".join(map(str, range(1, size)))
    assert "rank 0" in str(caught.value) and others in str(caught.value), caught.value
    assert isinstance(caught.value, hvd.TensorMismatchError) == (mode == "eager")
    # The job goes on: the next collective of every mode runs.
    total = lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum)  # noqa: E731
    np.testing.assert_array_equal(in_a_session(total) if mode == "session" else run(mode, total), [size] * 2)


def test_compat_v1_graph_broadcasts_global_variables_and_runs_the_hook(rank, size):
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        hvd.broadcast_global_variables(0)
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("weights", initializer=tf.fill([3], float(rank + 1)))
        step = tf.compat.v1.get_variable("step", initializer=tf.constant(rank * 10))
        sync = hvd.broadcast_global_variables(root_rank=size - 1)
        queries = [hvd.size_op(), hvd.rank_op()]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(sync)
            np.testing.assert_array_equal(session.run(weights), [float(size)] * 3)
            assert session.run(step) == (size - 1) * 10
            assert session.run(queries) == [size, rank]
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("weights", initializer=tf.fill([2], float(rank)))
        hook = hvd.BroadcastGlobalVariablesHook(0)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            np.testing.assert_array_equal(session.run(weights), [0.0, 0.0])
