"""What each layer of an nn.Sequential costs, for split_sequential to balance pipeline stages.

Time: each layer's forward and backward pass on a sample batch, measured one layer at a time
(its input the previous layer's output, detached) and taken as the median of a few repeats,
so that one preemption of the process does not move a cut. Parameters: each layer's count,
for a split by memory. Every rank must cut the same way, so the costs measured on the process
set's first rank are the ones every rank uses.
"""

import statistics
import time
from typing import List, Sequence

import torch

from ..core import runtime
from ..core.process_sets import global_process_set, ranks_in, size_in
from .functions import broadcast_object

__all__ = ["layer_parameters", "layer_seconds", "costs_of_first_rank"]


def layer_parameters(layers: Sequence[torch.nn.Module]) -> List[float]:
    """The number of parameters of each layer."""
    return [float(sum(parameter.numel() for parameter in layer.parameters())) for layer in layers]


def _forward_and_backward(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():
        x = x.detach().requires_grad_(True)
    y = layer(x)
    if y.requires_grad:
        y.backward(torch.ones_like(y))
    return y.detach()


def layer_seconds(layers: Sequence[torch.nn.Module], sample: torch.Tensor, repeats: int = 5) -> List[float]:
    """Seconds of each layer's forward and backward pass on `sample` (a batch for the first
    layer), the median of `repeats` after one unmeasured pass. The layers' gradients are as
    they were before."""
    if repeats < 1:
        raise ValueError(f"layer_seconds: repeats must be at least 1, got {repeats}")
    saved = [[(p, None if p.grad is None else p.grad.clone()) for p in layer.parameters()] for layer in layers]
    seconds, x = [], sample
    try:
        for layer in layers:
            output = _forward_and_backward(layer, x)  # warms up what runs once (allocations, kernels)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                _forward_and_backward(layer, x)
                times.append(time.perf_counter() - start)
            seconds.append(statistics.median(times))
            x = output
    finally:
        for layer_saved in saved:
            for parameter, grad in layer_saved:
                parameter.grad = grad
    return seconds


def costs_of_first_rank(costs: List[float], process_set=global_process_set) -> List[float]:
    """`costs` as the first rank of `process_set` measured them, on every rank of the set; as
    they are where hvdplus is not initialized or the set has one rank."""
    if not runtime.is_initialized() or size_in(process_set, "split_sequential") == 1:
        return costs
    first = ranks_in(process_set, "split_sequential")[0]
    return broadcast_object(costs, root_rank=first, name="split_sequential.costs", process_set=process_set)
