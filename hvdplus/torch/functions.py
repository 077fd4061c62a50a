"""Broadcasting a model's and an optimizer's state from one rank, and object collectives.

Each takes `process_set=` (default: the whole job); `root_rank` is a job rank of that set."""

import torch

from ..core import collectives, runtime
from ..core.process_sets import global_process_set
from .mpi_ops import broadcast_async_

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def _named_tensors(params):
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if items and not (isinstance(items[0], tuple) and len(items[0]) == 2):
        raise ValueError("broadcast_parameters takes a state_dict or model.named_parameters()")
    return items


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """Overwrite every rank's tensors with `root_rank`'s, in place.

    Args:
        params: `model.state_dict()` or `model.named_parameters()`.
        root_rank: the (job) rank whose values win.
        process_set: the ranks that take part (default: every rank).
    """
    handles = []
    for name, tensor in _named_tensors(params):
        if not isinstance(tensor, torch.Tensor):
            continue
        # .data: the parameters require grad, and this write must stay outside autograd.
        handles.append(broadcast_async_(tensor.data, root_rank, name=f"broadcast_parameters.{name}",
                                        process_set=process_set))
    for handle in handles:
        handle.wait()


def broadcast_optimizer_state(optimizer, root_rank=0, process_set=global_process_set):
    """Give every rank `root_rank`'s optimizer state: per-parameter tensors (momentum
    buffers, Adam moments, step counts) and hyper-parameters such as lr and momentum.

    As in Horovod, an optimizer with no state yet on this rank first takes one step on zero
    gradients, so that its state exists: every parameter that trains and has no gradient
    keeps that zero gradient afterwards (one without `requires_grad` keeps `None`), and a
    gradient it had is put back. The step changes no parameter unless the optimizer changes
    parameters on a zero gradient (weight decay), as Horovod's does. The state then travels
    pickled.

    Args:
        optimizer: a torch.optim optimizer, or one wrapped by DistributedOptimizer.
        root_rank: the (job) rank whose state wins.
        process_set: the ranks that take part (default: every rank).
    """
    own_way = getattr(optimizer, "_hvdplus_broadcast_state", None)
    if own_way is not None:  # a sharded optimizer (ZeroRedundancyOptimizer) reshards the root's state
        own_way(root_rank, process_set)
        return
    if not optimizer.state:
        _take_a_step_on_zero_gradients(optimizer)
    state = collectives.broadcast_object(
        optimizer.state_dict() if runtime.rank() == root_rank else None,
        root_rank, name="broadcast_optimizer_state", process_set=process_set,
    )
    optimizer.load_state_dict(state)


def _take_a_step_on_zero_gradients(optimizer):
    """Make a fresh optimizer's state by a step on zero gradients, on this rank alone.

    A DistributedOptimizer steps without reducing (other ranks may not prime at all), and
    L-BFGS, whose step needs a closure, is left to the pickled state alone."""
    if isinstance(optimizer, torch.optim.LBFGS):
        return
    # SparseAdam refuses dense gradients, so its zero gradients are sparse (and empty).
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    kept = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not param.requires_grad:
                continue
            if param.grad is not None:
                kept[param] = param.grad
            zero = torch.zeros_like(param)
            param.grad = zero.to_sparse() if sparse else zero
    getattr(optimizer, "_hvdplus_local_step", optimizer.step)()
    for param, grad in kept.items():
        param.grad = grad


def broadcast_object(obj=None, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s picklable `obj` (tensors included) on every rank (of `process_set`)."""
    return collectives.broadcast_object(obj, root_rank, name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's picklable `obj`, as a list in rank order (of `process_set`'s ranks)."""
    return collectives.allgather_object(obj, name, process_set=process_set)
