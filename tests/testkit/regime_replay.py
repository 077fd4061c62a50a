"""The numpy replay of the training regimes (tests/mpi/test_torch_regimes.py and
tests/mpi/keras/test_keras_regimes.py), and the checks that hold a run to it: every rank's data
(seeded by its rank alone), a linear model's least-squares gradient, SGD with momentum and Adam
written out in numpy, and the regimes themselves (synchronous, local SGD, DiLoCo) over all the
ranks at once. No framework and no hvdplus: the in-rank tests hold a real run's trajectory to
this one.

A model here is one flat float64 vector theta = (w_1, ..., w_F, b) of y ~ x @ w + b, and its loss
is the mean squared error over a batch, as torch.nn.functional.mse_loss computes it."""

import numpy as np

__all__ = ["FEATURES", "BATCH", "THETA0", "rank_data", "gradient", "Sgd", "Adam", "KerasAdam",
           "replay_synchronous", "replay_local_sgd", "replay_diloco", "replay_delayed", "RTOL", "assert_follows",
           "assert_ranks_drift_apart", "assert_unlike_training_alone", "assert_state_averaging_matters"]

RTOL = 1e-6  # a run's trajectory against its replay's, both float64
FEATURES, BATCH = 3, 8
THETA0 = np.array([0.5, -0.25, 0.125, 0.1])  # the same start on every rank: weights, then bias


def rank_data(rank, steps):
    """Rank `rank`'s batches: (x of shape (steps, BATCH, FEATURES), y of shape (steps, BATCH)),
    a different linear target per rank, so that the ranks' models drift apart between averagings.
    Fewer steps give the first batches of more."""
    rng = np.random.default_rng(1000 + rank)
    target = rng.standard_normal(FEATURES + 1)
    batches = [(rng.standard_normal((BATCH, FEATURES)), 0.1 * rng.standard_normal(BATCH)) for _ in range(steps)]
    x = np.array([batch for batch, _ in batches]).reshape(steps, BATCH, FEATURES)
    y = x @ target[:-1] + target[-1] + np.array([noise for _, noise in batches]).reshape(steps, BATCH)
    # Numbers that float32 holds exactly: Keras casts float arrays given to fit() to floatx.
    return x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)


def gradient(theta, x, y):
    """d/dtheta of mean((x @ w + b - y) ** 2)."""
    residual = x @ theta[:-1] + theta[-1] - y
    return np.concatenate([2 * x.T @ residual, [2 * residual.sum()]]) / len(y)


class Sgd:
    """torch.optim.SGD without dampening or weight decay."""

    def __init__(self, lr, momentum=0.0, nesterov=False):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.buffer = None

    def step(self, theta, grad):
        if self.momentum:
            self.buffer = grad.copy() if self.buffer is None else self.momentum * self.buffer + grad
            grad = grad + self.momentum * self.buffer if self.nesterov else self.buffer
        return theta - self.lr * grad

    @property
    def state(self):
        return [] if self.buffer is None else [self.buffer]

    @state.setter
    def state(self, arrays):
        if arrays:
            (self.buffer,) = arrays


class Adam:
    """torch.optim.Adam without weight decay or amsgrad."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8):
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.steps, self.m, self.v = 0, 0.0, 0.0

    def step(self, theta, grad):
        self.steps += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        denominator = np.sqrt(self.v) / np.sqrt(1 - self.beta2 ** self.steps) + self.eps
        return theta - self.lr / (1 - self.beta1 ** self.steps) * self.m / denominator

    @property
    def state(self):
        return [self.m, self.v]

    @state.setter
    def state(self, arrays):
        self.m, self.v = arrays


class KerasAdam(Adam):
    """keras.optimizers.Adam: torch's, but with epsilon added to sqrt(v) before the bias
    correction of v (Keras' default epsilon is 1e-7)."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-7):
        super().__init__(lr, betas, eps)

    def step(self, theta, grad):
        self.steps += 1
        self.m = self.m + (grad - self.m) * (1 - self.beta1)
        self.v = self.v + (grad * grad - self.v) * (1 - self.beta2)
        alpha = self.lr * np.sqrt(1 - self.beta2 ** self.steps) / (1 - self.beta1 ** self.steps)
        return theta - alpha * self.m / (np.sqrt(self.v) + self.eps)


def _mean(arrays):
    return sum(arrays) / len(arrays)


def replay_local_sgd(make_optimizer, nranks, steps, period, warmup_steps, average_state=False):
    """Every rank's parameters after each step of post-local SGD: steps before `warmup_steps`
    apply the ranks' mean gradient; after steps warmup_steps, warmup_steps + period, ... the
    parameters (and, with `average_state`, the optimizers' states) become the ranks' mean.
    Returns an array of shape (nranks, steps, FEATURES + 1)."""
    data = [rank_data(rank, steps) for rank in range(nranks)]
    thetas = [THETA0.copy() for _ in range(nranks)]
    optimizers = [make_optimizer() for _ in range(nranks)]
    trajectory = np.zeros((nranks, steps, len(THETA0)))
    for step in range(steps):
        grads = [gradient(thetas[rank], data[rank][0][step], data[rank][1][step]) for rank in range(nranks)]
        if step < warmup_steps:
            grads = [_mean(grads)] * nranks
        thetas = [optimizers[rank].step(thetas[rank], grads[rank]) for rank in range(nranks)]
        if step >= warmup_steps and (step - warmup_steps) % period == 0:
            thetas = [_mean(thetas)] * nranks
            if average_state:
                states = [_mean(parts) for parts in zip(*(optimizer.state for optimizer in optimizers))]
                for optimizer in optimizers:
                    optimizer.state = [array.copy() for array in states]
        trajectory[:, step] = thetas
    return trajectory


def replay_synchronous(make_optimizer, nranks, steps):
    """Synchronous data parallelism: every step applies the ranks' mean gradient."""
    return replay_local_sgd(make_optimizer, nranks, steps, period=1, warmup_steps=steps)


def replay_diloco(make_inner, nranks, steps, period, make_outer):
    """DiLoCo: local inner steps; after every `period` of them the outer optimizer steps from
    the last outer parameters along the ranks' mean of (last outer parameters - parameters),
    and every rank takes the result. The inner optimizers' states stay local."""
    data = [rank_data(rank, steps) for rank in range(nranks)]
    outer_theta = THETA0.copy()
    outer = make_outer()
    thetas = [THETA0.copy() for _ in range(nranks)]
    inners = [make_inner() for _ in range(nranks)]
    trajectory = np.zeros((nranks, steps, len(THETA0)))
    for step in range(steps):
        thetas = [inners[rank].step(thetas[rank], gradient(thetas[rank], data[rank][0][step], data[rank][1][step]))
                  for rank in range(nranks)]
        if (step + 1) % period == 0:
            outer_theta = outer.step(outer_theta, _mean([outer_theta - theta for theta in thetas]))
            thetas = [outer_theta.copy() for _ in range(nranks)]
        trajectory[:, step] = thetas
    return trajectory


def replay_delayed(make_optimizer, nranks, steps, averaged=None):
    """Bounded staleness 1: step t computes the ranks' mean gradient at the current parameters
    and applies the mean gradient of step t-1; step 0 applies nothing, and the optimizer's own
    state (momentum, Adam's step count) starts with step 1. Every rank holds the same parameters.
    `averaged`: the ranks whose data they train on (default: ranks 0 to nranks - 1)."""
    data = [rank_data(rank, steps) for rank in (range(nranks) if averaged is None else averaged)]
    theta = THETA0.copy()
    optimizer = make_optimizer()
    previous = None
    trajectory = np.zeros((nranks, steps, len(THETA0)))
    for step in range(steps):
        grad = _mean([gradient(theta, x[step], y[step]) for x, y in data])
        if previous is not None:
            theta = optimizer.step(theta, previous)
        previous = grad
        trajectory[:, step] = theta
    return trajectory


def assert_follows(trajectory, replay, rank, atol=1e-12):
    """A rank's run (its parameters after each step) is the replay's for that rank."""
    np.testing.assert_allclose(trajectory, replay[rank], rtol=RTOL, atol=atol)


def assert_ranks_drift_apart(replay, step):
    """The replay's ranks differ after `step`: a run that never stopped averaging would fail."""
    if len(replay) > 1:
        assert not np.allclose(replay[0, step], replay[1, step], rtol=RTOL), step


def assert_unlike_training_alone(make_optimizer, replay, rank, steps):
    """The ranks' data differ, so a rank training alone ends elsewhere than `replay` after its
    second step: a run that never averaged would fail."""
    if len(replay) > 1:
        alone = replay_local_sgd(make_optimizer, len(replay), steps, period=steps + 1, warmup_steps=0)
        assert not np.allclose(alone[rank, 1], replay[rank, 1], rtol=RTOL)


def assert_state_averaging_matters(make_optimizer, replay, rank, steps, period, warmup_steps, average_state):
    """Local SGD with the optimizer's state averaged (or not, the other way from `replay`) ends
    elsewhere: a run that got `average_state` wrong would fail."""
    if len(replay) > 1:
        other = replay_local_sgd(make_optimizer, len(replay), steps, period, warmup_steps, not average_state)
        assert not np.allclose(other[rank, -1], replay[rank, -1], rtol=RTOL)
