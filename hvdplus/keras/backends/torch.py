"""Keras' torch trainer applies gradients eagerly: hvdplus.torch's grouped all-reduce."""

from ... import torch as hvd_torch
from ...core.process_sets import global_process_set


def grouped_allreduce(tensors, variables, op, prescale_factor, postscale_factor, name, process_set=None):
    process_set = global_process_set if process_set is None else process_set
    if all(tensor is getattr(variable.value, "grad", None) for tensor, variable in zip(tensors, variables)):
        # model.fit hands the variables' own .grad, which Keras clears before the next pass:
        # reduced where they lie (no packing copy), as torch's DistributedOptimizer does.
        return hvd_torch.grouped_allreduce_(tensors, op=op, prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor, name=name, process_set=process_set)
    # Gradients of a custom loop stay untouched; the results are views of the group's
    # packed buffer, with no copy back.
    return hvd_torch.grouped_allreduce([t.detach().contiguous() for t in tensors], op=op,
                                       prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                       name=name, process_set=process_set)
