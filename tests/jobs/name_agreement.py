"""Collectives and their gradients, in TensorFlow (eagerly, in a tf.function, in a
tf.compat.v1 graph run by a Session), torch (autograd) and Keras' `fit`, whose names no rank gives
(hvdplus makes them up), with work that differs between ranks around them: before each
round every rank runs its own number of unrelated eager ops, tf.function traces, graph name
uses and torch autograd passes. A made-up name that depended on such work would differ
between ranks, and the collective would stall. tests/test_name_agreement.py runs it at 2
and 3 ranks with a short stall shutdown time, so that a stall fails the job at once.

Each round runs allreduce, allgather, broadcast (from every root in turn, as Horovod's
broadcast-gradient check does), alltoall and reducescatter (with scale factors) in an
order of its own, in every mode, and checks results and gradients against numpy; then
all-reduces and reducescatters (Sum and Average, with scale factors) on a process set of
the ranks but 0, which rank 0 skips: TensorFlow's and torch's reducescatter gradients must
equal numpy's and each other. Prints "names agree on rank <r>" at the end.

`--misname-rank R`: in round 1, rank R names its eager broadcast itself, as a made-up name
that depended on the rank would; the job must then stop with a stall on every rank.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import keras  # noqa: E402

import hvdplus.keras as hvd_keras  # noqa: E402
import hvdplus.tensorflow as hvd  # noqa: E402
import hvdplus.torch as hvd_torch  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--misname-rank", type=int, default=-1)
args = parser.parse_args()

tf.get_logger().setLevel("ERROR")  # the retracing warnings: every check traces functions of its own
hvd.init()
rank, size = hvd.rank(), hvd.size()
others = hvd.add_process_set(range(1, size))  # rank 0 stays out
KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
SCALES = (0.5, 3.0)  # reducescatter's prescale and postscale factors


# -- each rank's data and the numpy reference ------------------------------------------------
def splits(r, k):
    """The rows rank r sends each rank in round k's alltoall."""
    return [(r + j + k) % 2 + 1 for j in range(size)]


def rows(total, me, count):
    """The rows of `total` that member `me` of `count` keeps in a reducescatter (the first
    members one more)."""
    start = me * (total // count) + min(me, total % count)
    return slice(start, start + total // count + (me < total % count))


def data(kind, k, r):
    """Rank r's input to round k's `kind`."""
    count = {"allreduce": 3, "allgather": r + 1, "broadcast": 2, "alltoall": sum(splits(r, k)),
             "reducescatter": 2 * size + 1}[kind]
    return (np.arange(2 * count, dtype=np.float64).reshape(count, 2) - 2) * (r + 1) + 10 * k + 0.5 * r


def weight(shape, k, r):
    """Rank r's upstream gradient: its loss is sum(result * weight)."""
    return (np.arange(int(np.prod(shape))).reshape(shape) % 3 + 1) * (r + 1) + 0.25 * k


def scattered(inputs, me, op, upstreams):
    """(member `me`'s result, its gradient) of a reducescatter of `inputs` (one per member of
    a set) with SCALES, given each member's upstream gradient: Horovod's gradient gathers the
    members' upstream gradients, times both scale factors and, for Sum, the set's size."""
    total, count = len(inputs[0]), len(inputs)
    reduced = SCALES[1] * np.sum([SCALES[0] * x for x in inputs], 0) / (count if op == "Average" else 1)
    factor = SCALES[0] * SCALES[1] * (count if op == "Sum" else 1)
    return reduced[rows(total, me, count)], np.concatenate(upstreams) * factor


def expected(kind, k, r, root):
    """(rank r's result, rank r's gradient) of round k's `kind`, in numpy."""
    inputs = [data(kind, k, q) for q in range(size)]
    if kind == "allreduce":
        result = np.mean(inputs, 0)
        return result, np.mean([weight(result.shape, k, q) for q in range(size)], 0)
    if kind == "allgather":
        result = np.concatenate(inputs)
        start = sum(q + 1 for q in range(r))
        return result, np.mean([weight(result.shape, k, q) for q in range(size)], 0)[start:start + r + 1]
    if kind == "broadcast":
        mean = np.mean([weight(inputs[root].shape, k, q) for q in range(size)], 0)
        return inputs[root], mean if r == root else np.zeros_like(mean)
    if kind == "alltoall":
        def received(j):
            return np.concatenate([inputs[q][sum(splits(q, k)[:j]):][:splits(q, k)[j]] for q in range(size)])

        def sent_back(j):  # what rank j's gradient returns to rank r
            upstream = weight(received(j).shape, k, j)
            return upstream[sum(splits(q, k)[j] for q in range(r)):][:splits(r, k)[j]]

        return received(r), np.concatenate([sent_back(j) for j in range(size)])
    total = len(inputs[0])
    upstreams = [weight((len(range(total)[rows(total, q, size)]), 2), k, q) for q in range(size)]
    return scattered(inputs, r, "Average", upstreams)


# -- the collectives in each framework and mode ---------------------------------------------
def tf_call(kind, x, k, root, name=None):
    if kind == "allreduce":
        return hvd.allreduce(x, name=name)
    if kind == "allgather":
        return hvd.allgather(x, name=name)
    if kind == "broadcast":
        return hvd.broadcast(x, root, name=name)
    if kind == "alltoall":
        return hvd.alltoall(x, splits=splits(rank, k), name=name)[0]
    return hvd.reducescatter(x, name=name, prescale_factor=SCALES[0], postscale_factor=SCALES[1])


def upstream(kind, k, root):
    """This rank's upstream gradient; its result's shape is known to numpy, not to a graph."""
    return weight(expected(kind, k, rank, root)[0].shape, k, rank)


def tf_eager(kind, k, root, name=None):
    x = tf.constant(data(kind, k, rank))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf_call(kind, x, k, root, name)
        loss = tf.reduce_sum(y * upstream(kind, k, root))
    return y, tape.gradient(loss, x)


def tf_function(kind, k, root):
    return tf.function(lambda: tf_eager(kind, k, root))()


def tf_session(kind, k, root):
    with tf.Graph().as_default() as graph:
        unrelated_graph_work(graph, k)
        x = tf.constant(data(kind, k, rank))
        y = tf_call(kind, x, k, root)
        (grad,) = tf.gradients(y, x, grad_ys=tf.constant(upstream(kind, k, root)))
        with tf.compat.v1.Session() as session:
            # The gradient alone first, as Horovod's check fetches it: a Session runs only
            # what the fetches need.
            grad = session.run(grad)
            return session.run(y), grad


def torch_autograd(kind, k, root):
    x = torch.tensor(data(kind, k, rank), requires_grad=True)
    if kind == "allreduce":
        y = hvd_torch.allreduce(x)
    elif kind == "allgather":
        y = hvd_torch.allgather(x)
    elif kind == "broadcast":
        y = hvd_torch.broadcast(x, root)
    elif kind == "alltoall":
        y = hvd_torch.alltoall(x, splits=torch.tensor(splits(rank, k)))[0]
    else:
        y = hvd_torch.reducescatter(x, prescale_factor=SCALES[0], postscale_factor=SCALES[1])
    (y * torch.tensor(upstream(kind, k, root))).sum().backward()
    return y.detach(), x.grad


def check_set_reducescatter(k, op):
    """TensorFlow's and torch's reducescatter with SCALES over the set `others`, and their
    gradients: the same numbers, bit for bit, and numpy's."""
    me, count = others.ranks.index(rank), others.size()
    x = data("reducescatter", k, rank)
    upstreams = [weight((len(range(len(x))[rows(len(x), j, count)]), 2), k, q) for j, q in enumerate(others.ranks)]
    scales = dict(prescale_factor=SCALES[0], postscale_factor=SCALES[1], process_set=others)
    tf_x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(tf_x)
        tf_y = hvd.reducescatter(tf_x, op=getattr(hvd, op), **scales)
        loss = tf.reduce_sum(tf_y * upstreams[me])
    tf_grad = tape.gradient(loss, tf_x)
    torch_x = torch.tensor(x, requires_grad=True)
    torch_y = hvd_torch.reducescatter(torch_x, op=getattr(hvd_torch, op), **scales)
    (torch_y * torch.tensor(upstreams[me])).sum().backward()
    want = scattered([data("reducescatter", k, q) for q in others.ranks], me, op, upstreams)
    what = f"rank {rank}: round {k} reducescatter {op} on process set {others.ranks}"
    np.testing.assert_array_equal(tf_grad.numpy(), torch_x.grad.numpy(), err_msg=f"{what}: TensorFlow vs torch")
    np.testing.assert_array_equal(tf_y.numpy(), torch_y.detach().numpy(), err_msg=f"{what}: TensorFlow vs torch")
    check(what, [tf_y, tf_grad], want)


def keras_fit(k):
    """Two steps of Keras' `fit` (full batch, SGD) of a linear model through hvdplus.keras'
    DistributedOptimizer; its weights against numpy's averaged-gradient steps. The ranks have
    built other Keras layers before (unrelated_work), so Keras' own variable paths differ."""
    features = data("allreduce", k, rank)  # 3 rows, 2 features
    targets = features @ np.array([[1.0], [-2.0]]) + 0.5 * rank
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones",
                                                                    bias_initializer="zeros")])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    model.fit(features.astype("float32"), targets.astype("float32"), batch_size=3, epochs=2, verbose=0)
    kernel, bias = np.ones((2, 1)), np.zeros(1)
    for _ in range(2):
        gradients = []
        for r in range(size):
            x = data("allreduce", k, r)
            error = x @ kernel + bias - (x @ np.array([[1.0], [-2.0]]) + 0.5 * r)
            gradients.append((2 * x.T @ error / len(x), 2 * error.mean(0)))
        kernel = kernel - 0.01 * np.mean([g for g, _ in gradients], 0)
        bias = bias - 0.01 * np.mean([g for _, g in gradients], 0)
    got_kernel, got_bias = model.get_weights()
    np.testing.assert_allclose(got_kernel, kernel, rtol=1e-4, err_msg=f"rank {rank}: round {k} keras fit: kernel")
    np.testing.assert_allclose(got_bias, bias, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: round {k} keras fit: bias")


# -- work that differs between ranks --------------------------------------------------------
def unrelated_work(k):
    for step in range((rank + k) % 3 + 2 * rank):
        tf.add(tf.ones([2]), float(step))
        tf.function(lambda t: t * 2.0 + 1.0)(tf.constant(float(step)))
        tf.compat.v1.get_default_graph().unique_name("hvdplus_broadcast")
        torch.ones(2, requires_grad=True).mul(float(step)).sum().backward()
        keras.layers.Dense(1)  # advances Keras' layer-name counter ("dense_<n>") on this rank only


def unrelated_graph_work(graph, k):
    for step in range((rank + k) % 3 + 2 * rank):
        graph.unique_name("unrelated")
        tf.constant(float(step), name="unrelated")


# -- the rounds --------------------------------------------------------------------------------
def check(what, got, want):
    got = [np.asarray(value) for value in got]
    for value, reference, part in zip(got, want, ("result", "gradient")):
        np.testing.assert_allclose(value, reference, rtol=1e-12, atol=1e-12,
                                   err_msg=f"rank {rank}: {what}: {part}")


modes = {"tf eager": tf_eager, "tf.function": tf_function, "tf.compat.v1 session": tf_session,
         "torch autograd": torch_autograd}
for k in range(args.rounds):
    unrelated_work(k)
    kinds = KINDS[k % len(KINDS):] + KINDS[:k % len(KINDS)]
    for kind in kinds:
        roots = [(root + k) % size for root in range(size)] if kind == "broadcast" else [0]
        for mode, run in (modes.items() if k % 2 == 0 else reversed(modes.items())):
            for root in roots:
                misnamed = k == 1 and kind == "broadcast" and mode == "tf eager" and rank == args.misname_rank
                got = tf_eager(kind, k, root, "misnamed_broadcast") if misnamed else run(kind, k, root)
                check(f"round {k} {mode} {kind} from root {root}", got, expected(kind, k, rank, root))
    keras_fit(k)
    if others.included():  # the set's names are its own: the job's stay alike on every rank
        x, total = tf.constant(data("allreduce", k, rank)), sum(data("allreduce", k, r) for r in others.ranks)
        np.testing.assert_allclose(hvd.allreduce(x, op=hvd.Sum, process_set=others).numpy(), total)
        np.testing.assert_allclose(tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=others))(x), total)
        summed = hvd_torch.allreduce(torch.tensor(data("allreduce", k, rank)), op=hvd.Sum, process_set=others)
        np.testing.assert_allclose(summed.numpy(), total)
        for op in ("Sum", "Average"):
            check_set_reducescatter(k, op)
    unrelated_work(k + 1)

print(f"names agree on rank {rank}", flush=True)
