"""`TorchEstimator` and `TorchModel`: fit a torch model to a Spark DataFrame with hvdplus
(hvdplus.spark.torch.estimator). Loaded on first use: the ranks import the training module alone."""

import importlib

__all__ = ["TorchEstimator", "TorchModel"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("hvdplus.spark.torch.estimator"), name)
    raise AttributeError(f"module 'hvdplus.spark.torch' has no attribute {name!r}")
