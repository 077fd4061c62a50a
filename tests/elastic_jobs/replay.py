"""What the elastic test jobs (torch_train.py, numpy_train.py, torch_regimes.py) trained, as JSON
(`save`, `load`), and checks of it against an independent numpy replay of the steps they committed:
synchronous SGD with momentum (`replay`), local SGD and DiLoCo (`replay_regime`)."""

import json

import numpy as np

import hvdplus

SAMPLES, FEATURES = 96, 4
INITIAL_WEIGHT = np.linspace(-0.2, 0.2, FEATURES)  # and a bias of 0


def dataset():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = x @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5
    return x.astype(np.float64), y.astype(np.float64)


def save(path, log, resets, weight, bias, **more):
    """Write what a job trained, on rank 0 of its last launch, for `load`; `more` adds
    entries of the job's own (JSON values)."""
    if hvdplus.rank() == 0:
        with open(path, "w") as file:
            json.dump({"log": log, "size": hvdplus.size(), "resets": resets,
                       "weight": np.ravel(weight).tolist(), "bias": np.ravel(bias).tolist(), **more}, file)


def load(path):
    with open(path) as file:
        return json.load(file)


def check_every_sample_once(result, epochs=2):
    """Each epoch's committed steps cover every sample exactly once."""
    for epoch in range(epochs):
        ids = sorted(i for e, _, batches in result["log"] if e == epoch for batch in batches for i in batch)
        assert ids == list(range(SAMPLES)), f"epoch {epoch}: samples repeated or skipped"


def sizes(result):
    """The job size at each committed step."""
    return [size for _, size, _ in result["log"]]


def _gradient(theta, ids, data):
    """The mean-squared-error gradient of theta = (weights, bias) on the samples `ids`."""
    x, y = data
    error = x[ids] @ theta[:FEATURES] + theta[FEATURES] - y[ids]
    return np.concatenate([2 * error @ x[ids] / len(ids), [2 * error.mean()]])


def _initial_theta():
    return np.concatenate([INITIAL_WEIGHT, [0.0]])


def replay(result, lr=0.05, momentum=0.9):
    """The weights that SGD with momentum reaches over the logged steps, each averaging
    the ranks' mean-squared-error gradients, as DistributedOptimizer does."""
    data = dataset()
    theta = _initial_theta()
    velocity = None
    for _, _, batches in result["log"]:
        grad = np.mean([_gradient(theta, ids, data) for ids in batches], axis=0)
        velocity = grad if velocity is None else momentum * velocity + grad
        theta = theta - lr * velocity
    return theta[:FEATURES], theta[FEATURES]


def replay_regime(result, regime, period, lr=0.05, momentum=0.9, outer_lr=0.7, outer_momentum=0.9):
    """Every rank's theta = (weights, bias) after the logged steps, in the order of the last
    step's ranks. Each rank steps on its own batch (the log lists them in rank order):
    - "local_sgd": SGD with momentum, parameters and momentum averaged over the ranks of that
      step after steps 0, period, 2 * period, ... (LocalSGD without warm-up);
    - "diloco": plain inner SGD; after steps period - 1, 2 * period - 1, ... an outer SGD step
      with Nesterov momentum from the last outer theta along the ranks' mean of (outer theta -
      theta), which every rank takes.
    Step numbers count the logged steps, across re-forms. The ranks re-form from a commit,
    which must be a state of the whole job: where the number of ranks changes, the ranks'
    parameters (and momentum) must be the same, else AssertionError."""
    data = dataset()
    thetas = velocities = None
    outer, outer_velocity = _initial_theta(), None
    for step, (_, size, batches) in enumerate(result["log"]):
        if thetas is None:
            thetas, velocities = [_initial_theta()] * size, [None] * size
        elif size != len(thetas):
            differ = [rank for rank in range(1, len(thetas)) if not (
                np.array_equal(thetas[rank], thetas[0]) and np.array_equal(velocities[rank], velocities[0]))]
            assert not differ, (f"the job went on at {size} ranks before step {step} from the state of "
                                f"{len(thetas)} ranks whose parameters differ (ranks {differ} from rank 0)")
            thetas, velocities = [thetas[0]] * size, [velocities[0]] * size
        grads = [_gradient(theta, ids, data) for theta, ids in zip(thetas, batches)]
        if regime == "local_sgd":
            velocities = [grad if velocity is None else momentum * velocity + grad
                          for velocity, grad in zip(velocities, grads)]
            thetas = [theta - lr * velocity for theta, velocity in zip(thetas, velocities)]
            if step % period == 0:
                thetas, velocities = [np.mean(thetas, axis=0)] * size, [np.mean(velocities, axis=0)] * size
        else:
            thetas = [theta - lr * grad for theta, grad in zip(thetas, grads)]
            if (step + 1) % period == 0:
                delta = np.mean([outer - theta for theta in thetas], axis=0)
                outer_velocity = delta if outer_velocity is None else outer_momentum * outer_velocity + delta
                outer = outer - outer_lr * (delta + outer_momentum * outer_velocity)
                thetas = [outer] * size
    return thetas


def check_weights(result):
    weight, bias = replay(result)
    np.testing.assert_allclose(np.ravel(result["weight"]), weight, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.ravel(result["bias"]), [bias], rtol=1e-4, atol=1e-5)


def check_regime_weights(result, regime, period):
    """Every rank's final weights (torch_regimes.py's "ranks_weights") are those of
    `replay_regime`, at rtol 1e-6."""
    thetas = replay_regime(result, regime, period)
    assert len(result["ranks_weights"]) == len(thetas), (len(result["ranks_weights"]), len(thetas))
    for rank, (weights, theta) in enumerate(zip(result["ranks_weights"], thetas)):
        np.testing.assert_allclose(weights, theta, rtol=1e-6, atol=1e-12, err_msg=f"rank {rank}")
