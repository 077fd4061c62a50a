"""The gradient all-reduce of each Keras backend, run inside that backend's training step.

Each module has `grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor,
name, process_set, weight)`: the step's present gradients (what that backend hands the
optimizer) and their variables in; the gradients all-reduced over `process_set` (None: the
job) out, in that backend's kind of tensor; with `weight` (a step_weight.StepWeight), averaged
weighted by the count it reads when the step runs. `traced(tensors)` tells whether the
gradients are placeholders of a step being compiled. A module may also have
`prepare_training()`, which prepare_training calls for every DistributedOptimizer made on
its backend.
"""

import importlib

__all__ = ["for_backend", "prepare_training"]

_SUPPORTED = ("tensorflow", "torch", "jax")


def for_backend(backend: str):
    """The module for `backend` (imported on first use, so only that framework loads)."""
    if backend not in _SUPPORTED:
        raise NotImplementedError(
            f"hvdplus.keras all-reduces gradients on the {', '.join(_SUPPORTED[:-1])} and "
            f"{_SUPPORTED[-1]} backends, not {backend!r}"
        )
    return importlib.import_module(f"{__name__}.{backend}")


def prepare_training(backend: str):
    """Whatever `backend`'s module sets up, once, for Keras' training step to reduce gradients."""
    prepare = getattr(for_backend(backend), "prepare_training", None)
    if prepare is not None:
        prepare()
