"""Keras' torch trainer applies gradients eagerly: hvdplus.torch's grouped all-reduce."""

from ... import torch as hvd_torch
from ...core.process_sets import global_process_set

__all__ = ["grouped_allreduce", "traced"]


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None,
                      weight=None):
    process_set = global_process_set if process_set is None else process_set
    own_grads = all(tensor is getattr(variable.value, "grad", None) for tensor, variable in zip(tensors, variables))
    # Eager: this step's count is read as it runs.
    count = None if weight is None else weight.read()
    if count is not None:
        # Reduced in place: model.fit's own .grad tensors, a custom loop's gradients as copies.
        targets = tensors if own_grads else [t.detach().clone().contiguous() for t in tensors]
        weighted_op, prescale, postscale = weight.reduction
        return hvd_torch.grouped_allreduce_async_(targets, op=weighted_op, prescale_factor=prescale,
                                                  postscale_factor=postscale, name=name, process_set=process_set,
                                                  weight=count).wait()
    if own_grads:
        # model.fit hands the variables' own .grad, which Keras clears before the next pass:
        # reduced where they lie (no packing copy), as torch's DistributedOptimizer does.
        return hvd_torch.grouped_allreduce_(tensors, op=op, prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor, name=name, process_set=process_set)
    # Gradients of a custom loop stay untouched; the results are views of the group's
    # packed buffer, with no copy back.
    return hvd_torch.grouped_allreduce([t.detach().contiguous() for t in tensors], op=op,
                                       prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                       name=name, process_set=process_set)


def traced(tensors) -> bool:
    """Keras' torch trainer runs eagerly: its gradients are never placeholders of a trace."""
    return False
