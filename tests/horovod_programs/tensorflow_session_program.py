"""A TensorFlow 1 program written against Horovod's API (`import horovod.tensorflow as hvd`,
a tf.compat.v1 graph run by a Session), run by tests/test_horovod_compat.py under `horovodrun`
on 2 and 3 ranks. Prints "tensorflow_session program ok on rank <r>" at the end.

A graph without automatic control dependencies leaves the order of independent ops to
TensorFlow, which may pick another on each rank: one `sess.run` fetches 25 independent
collective ops (two in functions the graph holds), with one inter-op thread and with
several; each run must take under 10 s, and a watchdog ends a deadlocked rank with every
thread's stack. Every result is checked against numpy. Then the v1 ways to start training:
broadcast_global_variables and BroadcastGlobalVariablesHook in a graph built after
hvd.init(), and gradients all-reduced per variable (two independent collectives a step),
in a Session and in a MonitoredTrainingSession, against numpy's full-batch descent; and
Horovod's errors for what it refuses, of Horovod's classes."""

import faulthandler
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

tf.compat.v1.disable_eager_execution()
hvd.init()
rank, size = hvd.rank(), hvd.size()
WATCHDOG_S = 60


def base(i, r):
    """Collective i's tensor on rank r."""
    return (np.arange(6, dtype=np.float32).reshape(2, 3) - 2) * (i + 1) + r


def on_every_rank(i):
    return np.stack([base(i, r) for r in range(size)])


def rows_of(r, count):
    """Rank r's rows for alltoall: row j holds 100 r + j."""
    return (100 * r + np.arange(count, dtype=np.float32))[:, None] * np.ones((1, 2), np.float32)


def splits_of(r):
    return np.array([(r + d) % 3 for d in range(size)], np.int32)


def block(rows, r):
    """The rows rank r keeps of a reducescatter of `rows` rows."""
    start = r * (rows // size) + min(r, rows % size)
    return slice(start, start + rows // size + (r < rows % size))


def slices(i, r):
    """Rank r's tf.IndexedSlices for check i: one row of a (size + 1) x 2 table."""
    return np.array([[r + 1.0, i * (r + 1.0)]], np.float32), np.array([r], np.int64)


def gathered_slices(i, scale):
    table = np.zeros((size + 1, 2))
    for r in range(size):
        values, indices = slices(i, r)
        table[indices] += values
    return table * scale


def indexed(i):
    values, indices = slices(i, rank)
    return tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([size + 1, 2], tf.int64))


def collectives():
    """(what, tensor, expected) for the results of 25 independent collective ops, two of
    them in functions the graph holds (a tf.cond branch, a tf.function)."""
    mine = [tf.constant(base(i, rank)) for i in range(24)]
    received = np.concatenate([rows_of(q, splits_of(q).sum())[splits_of(q)[:rank].sum():][:splits_of(q)[rank]]
                               for q in range(size)])
    exchanged, exchanged_splits = hvd.alltoall(tf.constant(rows_of(rank, splits_of(rank).sum())),
                                               splits=tf.constant(splits_of(rank)))
    group = hvd.grouped_allreduce([mine[16], mine[17] * 2, tf.cast(mine[18], tf.float64)], op=hvd.Sum)
    mixed = hvd.grouped_allreduce([indexed(19), mine[19]], op=hvd.Average)
    gathers = hvd.grouped_allgather([tf.fill([rank + 1, 2], float(rank)), mine[20][:1 + rank % 2]])
    scatters = hvd.grouped_reducescatter([tf.tile(mine[21], [size, 1]), tf.tile(mine[21], [size + 1, 1])], op=hvd.Sum)
    every = [on_every_rank(i) for i in range(24)]
    return [
        ("average", hvd.allreduce(mine[0]), every[0].mean(0)),
        ("sum", hvd.allreduce(mine[1], op=hvd.Sum), every[1].sum(0)),
        ("min", hvd.allreduce(mine[2], op=hvd.Min), every[2].min(0)),
        ("max", hvd.allreduce(mine[3], op=hvd.Max), every[3].max(0)),
        ("product", hvd.allreduce(mine[4] / 8, op=hvd.Product), (every[4] / 8).prod(0)),
        ("scaled", hvd.allreduce(mine[5], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
         every[5].sum(0) * 1.5),
        ("integer average", hvd.allreduce(tf.cast(mine[6], tf.int32)),
         np.trunc(every[6].astype(np.int32).sum(0) / size)),
        ("average=False", hvd.allreduce(tf.cast(mine[7], tf.float64), average=False), every[7].sum(0)),
        ("fp16 compression", hvd.allreduce(mine[8], compression=hvd.Compression.fp16), every[8].mean(0)),
        ("scalar", hvd.allreduce(mine[9][0, 0], op=hvd.Max), every[9][:, 0, 0].max()),
        ("ragged allgather", hvd.allgather(mine[10][:1 + rank % 2]),
         np.concatenate([every[10][r][:1 + r % 2] for r in range(size)])),
        ("broadcast", hvd.broadcast(mine[11], root_rank=size - 1), every[11][size - 1]),
        ("integer broadcast", hvd.broadcast(tf.cast(mine[12], tf.int64), root_rank=0), every[12][0]),
        ("even alltoall", hvd.alltoall(tf.constant(rows_of(rank, 2 * size))),
         np.concatenate([rows_of(q, 2 * size)[2 * rank:2 * rank + 2] for q in range(size)])),
        ("alltoall with splits", exchanged, received),
        ("alltoall splits received", exchanged_splits, [splits_of(q)[rank] for q in range(size)]),
        ("reducescatter", hvd.reducescatter(tf.tile(mine[15], [size, 1])),
         np.tile(every[15], [1, size, 1]).mean(0)[block(2 * size, rank)]),
        ("grouped allreduce", tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in group], 0),
         np.concatenate([every[16].sum(0).ravel(), 2 * every[17].sum(0).ravel(), every[18].sum(0).ravel()])),
        ("group's sparse part", tf.convert_to_tensor(mixed[0]), gathered_slices(19, 1 / size)),
        ("group's dense part", mixed[1], every[19].mean(0)),
        ("sparse average", tf.convert_to_tensor(hvd.allreduce(indexed(20), op=hvd.Average)),
         gathered_slices(20, 1 / size)),
        ("grouped allgather", gathers[0], np.concatenate([np.full((r + 1, 2), float(r)) for r in range(size)])),
        ("grouped ragged allgather", gathers[1], np.concatenate([every[20][r][:1 + r % 2] for r in range(size)])),
        ("grouped reducescatter", tf.concat(scatters, 0),
         np.concatenate([np.tile(every[21], [1, size, 1]).sum(0)[block(2 * size, rank)],
                         np.tile(every[21], [1, size + 1, 1]).sum(0)[block(2 * size + 2, rank)]])),
        ("in tf.cond", tf.cond(tf.constant(True), lambda: hvd.allreduce(mine[22], op=hvd.Sum),
                               lambda: tf.zeros([2, 3])), every[22].sum(0)),
        ("in a tf.function", tf.function(lambda t: hvd.allreduce(t, op=hvd.Max))(mine[23]), every[23].max(0)),
    ]


def session_config(threads):
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads, intra_op_parallelism_threads=1)


def check_collectives():
    checks = collectives()
    assert len(checks) == 26
    fetches = [tensor for _, tensor, _ in checks]
    for threads in (1, 4):
        with tf.compat.v1.Session(config=session_config(threads)) as session:
            for _ in range(3):
                start = time.perf_counter()
                results = session.run(fetches)
                assert time.perf_counter() - start < 10.0, f"the collectives took {time.perf_counter() - start} s"
                for (what, _, expected), got in zip(checks, results):
                    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=f"{what}, {threads} threads")


def linear_model():
    """Rank-dependent start, this rank's rows, and SGD on gradients all-reduced one by one."""
    data = np.random.default_rng(3).standard_normal((2 * size, 4)).astype(np.float32)
    x, y = tf.constant(data[2 * rank:2 * rank + 2, :3]), tf.constant(data[2 * rank:2 * rank + 2, 3:])
    weights = tf.compat.v1.get_variable("weights", initializer=tf.fill([3, 1], 0.1 * rank))
    bias = tf.compat.v1.get_variable("bias", initializer=tf.constant([float(rank)]))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) + bias - y))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.2)
    reduced = [(hvd.allreduce(grad), variable) for grad, variable in optimizer.compute_gradients(loss)]
    train = optimizer.apply_gradients(reduced, global_step=tf.compat.v1.train.get_or_create_global_step())
    return data, weights, bias, train


def descent(data, start_rank, steps):
    """numpy's full-batch gradient descent from rank `start_rank`'s start."""
    weights, bias = np.full((3, 1), 0.1 * start_rank), np.array([float(start_rank)])
    for _ in range(steps):
        error = data[:, :3] @ weights + bias - data[:, 3:]
        weights, bias = weights - 0.2 * 2 * data[:, :3].T @ error / len(data), bias - 0.2 * 2 * error.mean(0)
    return weights, bias


def check_training():
    data, weights, bias, train = linear_model()
    sync = hvd.broadcast_global_variables(size - 1)
    with tf.compat.v1.Session(config=session_config(1)) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(sync)
        for _ in range(4):
            session.run(train)
        for got, expected in zip(session.run([weights, bias]), descent(data, size - 1, 4)):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks, config=session_config(1)) as session:
        session.run(train)
        for got, expected in zip(session.run([weights, bias]), descent(data, 0, 1)):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def check_refusals():
    """Horovod's errors: NotImplementedError when an IndexedSlices reduction Horovod does not
    support is built, InvalidArgumentError when an alltoall the ranks cannot split runs,
    FailedPreconditionError, naming the tensor and the ranks, when ranks disagree."""
    for refused in (dict(op=hvd.Max), dict(op=hvd.Sum, postscale_factor=2.0)):
        try:
            hvd.allreduce(indexed(0), **refused)
        except NotImplementedError:
            pass
        else:
            raise AssertionError(f"allreduce of IndexedSlices with {refused} did not raise NotImplementedError")
    uneven = hvd.alltoall(tf.ones([size + 1, 2]))
    with tf.compat.v1.Session(config=session_config(1)) as session:
        try:
            session.run(uneven)
        except tf.errors.InvalidArgumentError as error:
            assert "not divisible" in error.message, error.message
        else:
            raise AssertionError("an uneven alltoall without splits did not raise InvalidArgumentError")
    mismatched = hvd.allreduce(tf.ones([2] if rank == 0 else [3]), name="mismatched")
    with tf.compat.v1.Session(config=session_config(1)) as session:
        try:
            session.run(mismatched)
        except tf.errors.FailedPreconditionError as error:
            assert "Mismatched shapes for 'mismatched'" in error.message, error.message
            others = "rank 1" if size == 2 else "ranks " + ", ".join(map(str, range(1, size)))
            assert "rank 0" in error.message and others in error.message, error.message
        else:
            raise AssertionError("an allreduce whose shapes differ did not raise FailedPreconditionError")


# The private names Horovod's tests read, served by the alias.
assert not hvd._executing_eagerly() and not hvd.util._executing_eagerly()
assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {0: list(range(size))}
for check in (check_collectives, check_training, check_refusals):
    with tf.Graph().as_default():
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        check()
        faulthandler.cancel_dump_traceback_later()
print(f"tensorflow_session program ok on rank {rank}", flush=True)
