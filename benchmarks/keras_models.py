"""The Keras models the TensorFlow and Keras benchmarks train, with synthetic inputs.

"mlp" (8 Dense(256) layers) has 2 MB of gradients for little compute a step on one core:
communication-bound, the hard case. "cnn" is the ResNet-style CNN of the PyTorch benchmark
(torch_training.synthetic_cnn, 0.8 MB of gradients for far more compute a step), closer to
the ratio of compute to gradients that real training has.
"""

import dataclasses
from typing import Callable, Tuple

import keras
import numpy as np

__all__ = ["MODELS", "synthetic_data", "start_ranks"]


def mlp(width=256, depth=8):
    layers = [keras.Input((width,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def _residual_block(x, channels):
    out = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(x)
    out = keras.layers.ReLU()(keras.layers.BatchNormalization()(out))
    out = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(out)
    out = keras.layers.BatchNormalization()(out)
    return keras.layers.ReLU()(keras.layers.Add()([x, out]))


def cnn():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    for channels in (32, 64):
        if channels != 32:
            x = keras.layers.Conv2D(channels, 3, strides=2, padding="same", activation="relu")(x)
        x = _residual_block(_residual_block(x, channels), channels)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


@dataclasses.dataclass(frozen=True)
class BenchmarkModel:
    build: Callable[[], keras.Model]
    sample_shape: Tuple[int, ...]
    batch: int  # per rank
    # per timed round: enough to dwarf the timing's own cost (a model.fit's first 5 steps are
    # not timed, see harness.fit_seconds), few enough for the runs to take turns often
    steps: int
    label: str


MODELS = {
    "mlp": BenchmarkModel(mlp, (256,), 64, 60, "MLP 8 x 256"),
    "cnn": BenchmarkModel(cnn, (32, 32, 3), 32, 15, "ResNet-style CNN"),
}


def synthetic_data(model, rows, seed):
    """(x, y): `rows` samples of normal noise shaped for `model` (a BenchmarkModel), labels 0..9."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows,) + model.sample_shape).astype("float32"), rng.integers(0, 10, rows)


def start_ranks(hvd):
    """hvd.init(), after one compute thread per rank on the torch backend, as the other
    backends get from the environment these benchmarks set before importing Keras."""
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)
    hvd.init()
