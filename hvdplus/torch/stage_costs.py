"""What each layer of an nn.Sequential costs, for split_sequential to balance pipeline stages.

Time: each layer's forward and backward pass on a sample batch, measured one layer at a time
(its input the previous layer's output, detached) and taken as the fastest of a few rounds
over all the layers: a busy machine only ever adds time, so the fastest is the one least
disturbed, and a busy spell falls on every layer of a round alike. Parameters:
each layer's count, for a split by memory. Every rank must cut the same way, so the process set's first rank
measures and every rank uses its costs (or raises its error).
"""

import time
from typing import Callable, List, Sequence

import torch

from ..core import runtime
from ..core.process_sets import global_process_set, ranks_in, size_in
from .functions import broadcast_object

__all__ = ["layer_parameters", "layer_seconds", "measured_on_first_rank"]


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


def _synchronize(sample: torch.Tensor) -> None:
    # A GPU runs kernels after they are launched: time what it computed, not the launches.
    if sample.is_cuda:
        torch.cuda.synchronize(sample.device)


def layer_seconds(layers: Sequence[torch.nn.Module], sample: torch.Tensor, repeats: int = 5) -> List[float]:
    """Seconds of each layer's forward and backward pass on `sample` (a batch for the first
    layer), the fastest of `repeats` rounds over the layers after one unmeasured pass. The
    layers' gradients and buffers (BatchNorm's running statistics) and the random generators
    (Dropout's) are as they were before."""
    if repeats < 1:
        raise ValueError(f"layer_seconds: repeats must be at least 1, got {repeats}")
    grads = [(p, None if p.grad is None else p.grad.clone()) for layer in layers for p in layer.parameters()]
    buffers = [(b, b.clone()) for layer in layers for b in layer.buffers()]
    random_state = torch.random.get_rng_state()
    cuda_random_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        inputs = [sample]
        for layer in layers:  # unmeasured: warms up what runs once (allocations, kernels)
            inputs.append(_forward_and_backward(layer, inputs[-1]))
        times = [[] for _ in layers]
        # Round after round over all the layers, rather than each layer's repeats in a row:
        # a busy spell then slows every layer's pass of that round alike, where in a row it
        # could slow all of one layer's passes and none of the next one's.
        for _ in range(repeats):
            for index, layer in enumerate(layers):
                _synchronize(sample)
                start = time.perf_counter()
                _forward_and_backward(layer, inputs[index])
                _synchronize(sample)
                times[index].append(time.perf_counter() - start)
        seconds = [min(layer_times) for layer_times in times]
    finally:
        for parameter, grad in grads:
            parameter.grad = grad
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        torch.random.set_rng_state(random_state)
        if cuda_random_state is not None:
            torch.cuda.set_rng_state_all(cuda_random_state)
    return seconds


def measured_on_first_rank(measure: Callable[[], List[float]], process_set=global_process_set) -> List[float]:
    """What `measure()` gives on the first rank of `process_set`, on every rank of the set (the
    others do not measure); its error raised on every rank where it fails. Where hvdplus is not
    initialized, or the set has one rank, `measure()` here."""
    if not runtime.is_initialized() or size_in(process_set, "split_sequential") == 1:
        return measure()
    first = ranks_in(process_set, "split_sequential")[0]
    outcome = None
    if runtime.rank() == first:
        try:
            outcome = measure()
        except Exception as error:  # every rank raises it, rather than wait for costs
            outcome = error
    outcome = broadcast_object(outcome, root_rank=first, name="split_sequential.costs", process_set=process_set)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
