"""hvdplus.tensorflow collectives, their gradients, broadcast_variables, DistributedGradientTape
and DistributedOptimizer on process sets, eagerly and inside tf.function, against numpy.

The job splits into two disjoint sets, the even and the odd ranks, which run their collectives
at the same time: on 2 ranks two sets of one, on 3 ranks a set of two (ranks 0 and 2: a root
that is job rank 2 is the set's second) and a set of one. Needs two ranks."""

import os
import re

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import hvdplus.tensorflow as hvd  # noqa: E402
from testkit.rank_data import rank_values  # noqa: E402
from testkit.tensorflow_modes import MODES, gradient_of, run  # noqa: E402

pytestmark = pytest.mark.skipif(hvd.size() < 2, reason="process sets other than the job's need two ranks")


@pytest.fixture
def sets(even_and_odd_sets):
    return even_and_odd_sets


@pytest.fixture
def mine(sets):
    return sets[0]


def members(process_set, shape, seed, dtype="float64"):
    """Every member's data (rank_values), stacked in the set's rank order."""
    return np.stack([rank_values(dtype, shape, r, seed) for r in process_set.ranks])


def mine_of(shape, seed, dtype="float64"):
    return tf.constant(rank_values(dtype, shape, hvd.rank(), seed))


# -- collectives -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_and_grouped_allreduce_reduce_over_the_set(mode, mine):
    assert (mine.size(), mine.rank()) == (len(mine.ranks), mine.ranks.index(hvd.rank()))
    x = mine_of((4, 3), 1)
    total = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=mine), x)
    np.testing.assert_allclose(total.numpy(), members(mine, (4, 3), 1).sum(0))
    # Average divides by the set's size; the scale factors apply as on the job.
    mean = run(mode, lambda t: hvd.allreduce(t, prescale_factor=2.0, postscale_factor=0.5, process_set=mine), x)
    np.testing.assert_allclose(mean.numpy(), members(mine, (4, 3), 1).mean(0))
    ints = mine_of((3,), 2, "int32")
    grouped = run(mode, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, process_set=mine), x, ints)
    np.testing.assert_allclose(grouped[0].numpy(), members(mine, (4, 3), 1).sum(0))
    np.testing.assert_array_equal(grouped[1].numpy(), members(mine, (3,), 2, "int32").sum(0))
    assert grouped[1].dtype == tf.int32


@pytest.mark.parametrize("mode", MODES)
def test_allgather_concatenates_in_the_sets_rank_order(mode, mine):
    rows = hvd.rank() + 1  # uneven rows
    gathered = run(mode, lambda t: hvd.allgather(t, process_set=mine), mine_of((rows, 2), 3))
    expected = np.concatenate([rank_values("float64", (r + 1, 2), r, 3) for r in mine.ranks])
    np.testing.assert_array_equal(gathered.numpy(), expected)
    pair = run(mode, lambda t: hvd.grouped_allgather([t, t[:1]], process_set=mine), mine_of((rows, 2), 3))
    np.testing.assert_array_equal(pair[1].numpy(), expected[np.cumsum([0] + [r + 1 for r in mine.ranks[:-1]])])


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_from_a_job_rank_of_the_set(mode, mine):
    for root in mine.ranks:
        given = run(mode, lambda t: hvd.broadcast(t, root_rank=root, process_set=mine), mine_of((3, 2), 4))
        np.testing.assert_array_equal(given.numpy(), rank_values("float64", (3, 2), root, 4))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_sends_rows_to_the_sets_ranks(mode, mine):
    # Member i sends i + 1 rows to every member: it receives j + 1 rows from member j.
    me = mine.rank()
    splits = [me + 1] * mine.size()
    sent = tf.fill([sum(splits), 2], float(hvd.rank()))
    received, received_splits = run(mode, lambda t, s: hvd.alltoall(t, splits=s, process_set=mine),
                                    sent, tf.constant(splits))
    assert received_splits.numpy().tolist() == [i + 1 for i in range(mine.size())]
    assert received_splits.shape == (mine.size(),)
    expected = np.concatenate([np.full((j + 1, 2), float(r)) for j, r in enumerate(mine.ranks)])
    np.testing.assert_array_equal(received.numpy(), expected)
    even = run(mode, lambda t: hvd.alltoall(t, process_set=mine), tf.fill([mine.size(), 1], float(hvd.rank())))
    np.testing.assert_array_equal(even.numpy().ravel(), np.array(mine.ranks, dtype=float))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda op: op.label)
def test_reducescatter_keeps_the_sets_blocks(op, mode, mine):
    rows = 2 * mine.size() + 1
    block = run(mode, lambda t: hvd.reducescatter(t, op=op, process_set=mine), mine_of((rows, 3), 5))
    reduced = members(mine, (rows, 3), 5)
    reduced = reduced.sum(0) if op == hvd.Sum else reduced.mean(0)
    me = mine.rank()
    start = 0 if me == 0 else 2 * me + 1
    np.testing.assert_allclose(block.numpy(), reduced[start:start + (3 if me == 0 else 2)])


def test_barrier_join_and_objects(mine):
    hvd.barrier(process_set=mine)
    tf.function(lambda: hvd.barrier(process_set=mine))()
    # join's answer is a job rank of the set.
    assert int(hvd.join(process_set=mine)) in mine.ranks
    assert int(tf.function(lambda: hvd.join(process_set=mine))()) in mine.ranks
    root = mine.ranks[-1]
    assert hvd.broadcast_object({"from": hvd.rank()}, root_rank=root, process_set=mine) == {"from": root}
    assert hvd.allgather_object(hvd.rank() * 10, process_set=mine) == [r * 10 for r in mine.ranks]


@pytest.mark.parametrize("mode", MODES)
def test_disjoint_sets_run_side_by_side_with_the_jobs_collectives(mode, mine, sets):
    # The even ranks run more unnamed collectives on their set than the odd ones: names are
    # counted per set (eagerly and in a graph), so the job's collectives after them still pair up.
    calls = 3 if mine.ranks[0] == 0 else 1

    def step(x):
        for _ in range(calls):
            x = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
        return x, hvd.allreduce(tf.ones([2]), op=hvd.Sum)

    in_set, in_job = run(mode, step, tf.ones([2]))
    np.testing.assert_array_equal(in_set.numpy(), np.full(2, float(mine.size() ** calls)))
    np.testing.assert_array_equal(in_job.numpy(), np.full(2, float(hvd.size())))
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


# -- gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_gradients_run_over_the_same_set(mode, mine):
    rank, n = hvd.rank(), mine.size()
    weight = float(rank + 1)  # rank r weights its result by r + 1
    set_weights = sum(r + 1.0 for r in mine.ranks)
    x = tf.Variable(tf.ones([2, 2]))
    (summed,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum, process_set=mine)) * weight, x)
    np.testing.assert_allclose(summed.numpy(), np.full((2, 2), set_weights))
    (mean,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.allreduce(x, process_set=mine)) * weight, x)
    np.testing.assert_allclose(mean.numpy(), np.full((2, 2), set_weights / n))
    (grouped,) = gradient_of(mode, lambda: tf.reduce_sum(
        hvd.grouped_allreduce([x], op=hvd.Sum, process_set=mine)[0]) * weight, x)
    np.testing.assert_allclose(grouped.numpy(), np.full((2, 2), set_weights))
    y = tf.Variable(tf.ones([rank + 1, 2]))
    (gathered,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.allgather(y, process_set=mine)) * weight, y)
    # Horovod's gradients: allgather's and broadcast's average over the set.
    np.testing.assert_allclose(gathered.numpy(), np.full((rank + 1, 2), set_weights / n))
    root = mine.ranks[-1]
    (given,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.broadcast(x, root, process_set=mine)) * weight, x)
    np.testing.assert_allclose(given.numpy(), np.full((2, 2), set_weights / n if rank == root else 0.0))
    z = tf.Variable(tf.ones([2 * n, 2]))
    # Member i weights what it received by i + 1: the rows sent to member j come back with j + 1.
    (exchanged,) = gradient_of(mode, lambda: tf.reduce_sum(
        hvd.alltoall(z, splits=[2] * n, process_set=mine)[0]) * (mine.rank() + 1), z)
    np.testing.assert_allclose(exchanged.numpy(), np.repeat(np.arange(1.0, n + 1), 2)[:, None] * np.ones((1, 2)))
    (scattered,) = gradient_of(mode, lambda: tf.reduce_sum(hvd.reducescatter(z, process_set=mine)) * weight, z)
    blocks = np.repeat([r + 1.0 for r in mine.ranks], 2)[:, None] * np.ones((1, 2))
    np.testing.assert_allclose(scattered.numpy(), blocks)  # Average: the blocks gathered, as Horovod


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_are_averaged_over_the_set(mode, mine):
    rank = hvd.rank()

    def reduce(values, indices):
        return tf.convert_to_tensor(hvd.allreduce(tf.IndexedSlices(values, indices, [4, 2]), process_set=mine))

    reduced = run(mode, reduce, tf.fill([1, 2], float(rank + 1)), tf.constant([rank % 4]))
    expected = np.zeros((4, 2))
    for r in mine.ranks:
        expected[r % 4] += (r + 1) / mine.size()
    np.testing.assert_allclose(reduced.numpy(), expected)


# -- training two replica groups -------------------------------------------------------------------
STEPS, BATCH = 3, 4


def rank_batches(rank):
    rng = np.random.default_rng([11, rank])
    return (rng.normal(size=(STEPS, BATCH, 3)).astype("float32"), rng.normal(size=(STEPS, BATCH, 1)).astype("float32"))


def reference_weights(process_set, lr=0.1):
    """Plain numpy: a linear model trained by SGD on the gradients averaged over the set's members."""
    kernel, bias = np.full((3, 1), 0.5), np.zeros(1)
    data = [rank_batches(r) for r in process_set.ranks]
    for step in range(STEPS):
        grads = []
        for x, y in data:
            residual = x[step] @ kernel + bias - y[step]  # d mean(residual**2) below
            grads.append((2 * x[step].T @ residual / residual.size, 2 * residual.sum(0) / residual.size))
        kernel = kernel - lr * np.mean([g[0] for g in grads], axis=0)
        bias = bias - lr * np.mean([g[1] for g in grads], axis=0)
    return kernel, bias


@pytest.mark.parametrize("mode", MODES)
def test_gradient_tape_trains_each_set_as_one_replica_group(mode, mine):
    kernel, bias = tf.Variable(tf.fill([3, 1], 0.5)), tf.Variable(tf.zeros([1]))
    xs, ys = rank_batches(hvd.rank())

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, kernel) + bias - y) ** 2)
        grads = hvd.DistributedGradientTape(tape, process_set=mine).gradient(loss, [kernel, bias])
        for variable, grad in zip([kernel, bias], grads):
            variable.assign_sub(0.1 * grad)

    step = train_step if mode == "eager" else tf.function(train_step)
    for index in range(STEPS):
        step(tf.constant(xs[index]), tf.constant(ys[index]))
    expected_kernel, expected_bias = reference_weights(mine)
    np.testing.assert_allclose(kernel.numpy(), expected_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias.numpy(), expected_bias, rtol=1e-5, atol=1e-6)


def test_gradient_tape_of_a_set_without_this_rank_leaves_its_gradients_alone(sets):
    # Horovod's tape: a rank outside the set has no one to reduce with.
    x = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(x * x) * (hvd.rank() + 1)
    (grad,) = hvd.DistributedGradientTape(tape, process_set=sets[1]).gradient(loss, [x])
    np.testing.assert_allclose(grad.numpy(), [2.0 * (hvd.rank() + 1), 4.0 * (hvd.rank() + 1)])


@pytest.mark.parametrize("mode", MODES)
def test_distributed_optimizer_averages_over_its_set(mode, sets):
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.keras is Keras on TensorFlow")
    mine, other = sets
    for process_set, expected in [(mine, np.mean(mine.ranks) + 1), (other, hvd.rank() + 1.0)]:
        # On a set without this rank, Horovod's optimizer applies this rank's own gradient.
        variable = keras.Variable(np.zeros(2, dtype="float32"))
        optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), process_set=process_set)

        def step():
            optimizer.apply_gradients([(tf.fill([2], hvd.rank() + 1.0), variable)])

        run(mode, step)
        np.testing.assert_allclose(variable.numpy(), np.full(2, -expected))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_variables_from_a_job_rank_of_the_set(mode, mine):
    root = mine.ranks[-1]
    variables = [tf.Variable(tf.fill([2, 2], float(hvd.rank()))), tf.Variable([hvd.rank(), 7], dtype=tf.int64)]
    run(mode, lambda: hvd.broadcast_variables(variables, root_rank=root, process_set=mine))
    np.testing.assert_array_equal(variables[0].numpy(), np.full((2, 2), float(root)))
    assert variables[1].numpy().tolist() == [root, 7]


# -- a rank outside the set ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_a_rank_outside_the_set_gets_horovods_invalid_argument_error(mode, sets):
    other = sets[1]
    message = re.escape(f"on process set {other.ranks}, which does not include rank {hvd.rank()}")
    x, variable = tf.ones([2, 2]), tf.Variable(tf.ones([2, 2]))
    calls = {
        "allreduce": lambda: hvd.allreduce(x, process_set=other),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([x], process_set=other),
        "allgather": lambda: hvd.allgather(x, process_set=other),
        "grouped_allgather": lambda: hvd.grouped_allgather([x], process_set=other),
        "broadcast": lambda: hvd.broadcast(x, other.ranks[0], process_set=other),
        "alltoall": lambda: hvd.alltoall(x, process_set=other),
        "reducescatter": lambda: hvd.reducescatter(x, process_set=other),
        "barrier": lambda: hvd.barrier(process_set=other),
        "join": lambda: hvd.join(process_set=other),
        "broadcast_variables": lambda: hvd.broadcast_variables([variable], other.ranks[0], process_set=other),
    }
    if mode == "eager":
        calls["broadcast_object"] = lambda: hvd.broadcast_object(1, other.ranks[0], process_set=other)
        calls["allgather_object"] = lambda: hvd.allgather_object(1, process_set=other)
    for kind, call in calls.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{kind}() ") + message) as caught:
            run(mode, call)
        assert isinstance(caught.value, ValueError)  # still the core's class too
    # A set hvdplus does not hold (a forged id, as Horovod's test makes one) is a ValueError alone.
    forged = hvd.ProcessSet([0])
    forged.process_set_id = 10
    with pytest.raises(ValueError, match="was removed") as caught:
        run(mode, lambda: hvd.allreduce(x, process_set=forged))
    assert not isinstance(caught.value, tf.errors.OpError)
    # Nothing was left half-submitted: both sets and the job still work.
    assert hvd.allgather_object(hvd.rank(), process_set=sets[0]) == sets[0].ranks
    np.testing.assert_array_equal(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [hvd.size()])
