"""`KerasEstimator` and `KerasModel`: fit a Keras 3 model to a Spark DataFrame with hvdplus, on
the tensorflow, torch or jax backend (hvdplus.spark.keras.estimator). Loaded on first use: the
ranks import the training module alone."""

import importlib

__all__ = ["KerasEstimator", "KerasModel"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("hvdplus.spark.keras.estimator"), name)
    raise AttributeError(f"module 'hvdplus.spark.keras' has no attribute {name!r}")
