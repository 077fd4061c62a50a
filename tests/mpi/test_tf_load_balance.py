"""Weighted averages in the TensorFlow adapter on real ranks: `allreduce(weight=)` against numpy,
eagerly and in a tf.function, and DistributedGradientTape over uneven local batches (by
`local_samples` or a LoadBalancer) against one process training plain TensorFlow on the union
of the batches."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import hvdplus.tensorflow as hvd  # noqa: E402
from testkit.tensorflow_modes import MODES, run  # noqa: E402
from testkit.weighted_reference import counts, numpy_weighted_average, values_of  # noqa: E402
from testkit import weighted_reference  # noqa: E402

STEPS = 10
FEATURES, HIDDEN, OUTPUTS = 6, 16, 3


# -- hvdplus.tensorflow.allreduce(weight=) -------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_weighted_allreduce_equals_numpy(mode, rank, size):
    weights = counts(size)
    expected = numpy_weighted_average([values_of(r) for r in range(size)], weights)
    tensor = tf.constant(values_of(rank), dtype=tf.float32)
    result = run(mode, lambda: hvd.allreduce(tensor, op=hvd.Average, weight=tf.constant(weights[rank]),
                                             name="weighted.new"))
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6, atol=1e-6)
    if size > 1:  # the plain average differs wherever the counts do
        assert not np.allclose(result.numpy(), np.mean([values_of(r) for r in range(size)], axis=0), atol=1e-3)


def test_the_gradient_of_a_weighted_average(rank, size):
    # y = sum_j(w_j x_j) / W on every rank; rank k's loss is sum(c_k * y): the gradient of the
    # summed losses with respect to x_i is (w_i / W) * sum_k(c_k).
    weights = counts(size)
    x = tf.Variable(values_of(rank))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(x, weight=weights[rank], name="weighted.grad") * values_of(50 + rank))
    expected = weights[rank] / sum(weights) * sum(values_of(50 + k) for k in range(size))
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), expected, rtol=1e-12)


def test_a_weight_with_another_op_raises_on_every_rank_naming_the_tensor(rank, size):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'weighted\.sum'.*op=Average"):
        hvd.allreduce(tf.ones(3), op=hvd.Sum, weight=1.0, name="weighted.sum")


@pytest.mark.parametrize("grouped", [False, True], ids=["allreduce", "grouped_allreduce"])
def test_a_weight_that_is_no_number_on_one_rank_raises_on_every_rank(grouped, rank, size):
    weight = "three" if rank == size - 1 else 1.0
    name = f"weighted.word.{grouped}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"'{name}'.*weight 'three' is not a number"):
        if grouped:
            hvd.grouped_allreduce([tf.ones(3), tf.ones(2)], weight=weight, name=name)
        else:
            hvd.allreduce(tf.ones(3), weight=weight, name=name)


# -- DistributedGradientTape over uneven batches -------------------------------------------
def model_variables():
    rng = np.random.default_rng(0)
    return [tf.Variable(rng.normal(size=shape).astype("float32") * 0.5)
            for shape in ((FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, OUTPUTS), (OUTPUTS,))]


def loss_of(variables, x, y):
    # The mean over this rank's own samples: what the weights make exact.
    w1, b1, w2, b2 = variables
    return tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2 - y) ** 2)


class Momentum:
    """SGD with momentum, written out so that both sides apply the very same update."""

    def __init__(self, variables, lr=0.1, momentum=0.9):
        self.lr, self.momentum = lr, momentum
        self.velocity = [tf.Variable(tf.zeros_like(v)) for v in variables]

    def apply(self, variables, grads):
        for variable, velocity, grad in zip(variables, self.velocity, grads):
            velocity.assign(self.momentum * velocity + grad)
            variable.assign_sub(self.lr * velocity)


class Adam:
    def __init__(self, variables, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8):
        self.lr, self.beta1, self.beta2, self.epsilon = lr, beta1, beta2, epsilon
        self.m = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.t = tf.Variable(0.0)

    def apply(self, variables, grads):
        self.t.assign_add(1.0)
        for variable, m, v, grad in zip(variables, self.m, self.v, grads):
            m.assign(self.beta1 * m + (1 - self.beta1) * grad)
            v.assign(self.beta2 * v + (1 - self.beta2) * grad * grad)
            m_hat = m / (1 - self.beta1 ** self.t)
            v_hat = v / (1 - self.beta2 ** self.t)
            variable.assign_sub(self.lr * m_hat / (tf.sqrt(v_hat) + self.epsilon))


OPTIMIZERS = {"sgd-momentum": Momentum, "adam": Adam}


def global_batches(total, steps=STEPS):
    return weighted_reference.global_batches(total, steps, FEATURES, OUTPUTS)


def union_training(optimizer_name, batches):
    """The independent reference: one process, plain TensorFlow, every rank's samples at once."""
    variables = model_variables()
    optimizer = OPTIMIZERS[optimizer_name](variables)
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_of(variables, x, y)
        optimizer.apply(variables, tape.gradient(loss, variables))
    return variables


def assert_same_weights(variables, reference):
    for index, (got, want) in enumerate(zip(variables, reference)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"variable {index}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_uneven_batches_train_like_one_process_on_their_union(optimizer_name, mode, rank, size):
    sizes = counts(size)
    start = sum(sizes[:rank])
    batches = global_batches(sum(sizes))
    variables = model_variables()
    optimizer = OPTIMIZERS[optimizer_name](variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(variables, x, y)
        # Eagerly the count as a number; in a graph as the batch's traced size.
        samples = len(x) if mode == "eager" else tf.shape(x)[0]
        tape = hvd.DistributedGradientTape(tape, local_samples=samples)
        optimizer.apply(variables, tape.gradient(loss, variables))

    step = step if mode == "eager" else tf.function(step)
    for x, y in batches:
        step(x[start:start + sizes[rank]], y[start:start + sizes[rank]])
    assert_same_weights(variables, union_training(optimizer_name, batches))


def test_a_load_balancers_sizes_weigh_the_gradients_as_they_change(rank, size):
    global_batch = 60
    balancer = hvd.LoadBalancer(global_batch, smoothing=1.0, hysteresis=0.0, warmup_steps=0)
    variables = model_variables()
    optimizer = Momentum(variables)
    batches = global_batches(global_batch)
    history = []
    for step, (x, y) in enumerate(batches):
        mine = balancer.slice(np.arange(global_batch))
        with tf.GradientTape() as tape:
            loss = loss_of(variables, x[mine], y[mine])
        tape = hvd.DistributedGradientTape(tape, load_balancer=balancer)
        optimizer.apply(variables, tape.gradient(loss, variables))
        history.append(weighted_reference.record_a_slow_start(balancer, len(mine), step, STEPS))
    weighted_reference.assert_the_sizes_moved(history, global_batch, size)
    assert_same_weights(variables, union_training("sgd-momentum", batches))


def test_weighting_with_another_op_is_refused(rank, size):
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match="needs op=Average"):
        hvd.DistributedGradientTape(tape, op=hvd.Sum, local_samples=3)
