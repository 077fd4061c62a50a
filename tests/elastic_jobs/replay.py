"""What the elastic test jobs (torch_train.py, numpy_train.py) trained, as JSON (`save`,
`load`), and checks of it against an independent numpy replay of the steps they committed."""

import json

import numpy as np

import hvdplus

SAMPLES, FEATURES = 96, 4


def dataset():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = x @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5
    return x.astype(np.float64), y.astype(np.float64)


def save(path, log, resets, weight, bias):
    """Write what a job trained, on rank 0 of its last launch, for `load`."""
    if hvdplus.rank() == 0:
        with open(path, "w") as file:
            json.dump({"log": log, "size": hvdplus.size(), "resets": resets,
                       "weight": np.ravel(weight).tolist(), "bias": np.ravel(bias).tolist()}, file)


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


def replay(result, lr=0.05, momentum=0.9):
    """The weights that SGD with momentum reaches over the logged steps, each averaging
    the ranks' mean-squared-error gradients, as DistributedOptimizer does."""
    x, y = dataset()
    weight = np.linspace(-0.2, 0.2, FEATURES)
    bias = 0.0
    velocity = None
    for _, _, batches in result["log"]:
        grads = []
        for ids in batches:
            error = x[ids] @ weight + bias - y[ids]
            grads.append(np.concatenate([2 * error @ x[ids] / len(ids), [2 * error.mean()]]))
        grad = np.mean(grads, axis=0)
        velocity = grad if velocity is None else momentum * velocity + grad
        weight = weight - lr * velocity[:FEATURES]
        bias = bias - lr * velocity[FEATURES]
    return weight, bias


def check_weights(result):
    weight, bias = replay(result)
    np.testing.assert_allclose(np.ravel(result["weight"]), weight, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.ravel(result["bias"]), [bias], rtol=1e-4, atol=1e-5)
