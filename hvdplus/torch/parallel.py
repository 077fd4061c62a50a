"""Tensor parallelism: linear layers whose weight is split over the ranks of a process set.

    block = torch.nn.Sequential(
        ColumnParallelLinear(1024, 4096, process_set=tp),   # each rank: 4096/n outputs
        torch.nn.GELU(),
        RowParallelLinear(4096, 1024, process_set=tp),      # each rank: 4096/n inputs, summed
    )

A column-parallel layer keeps a slice of the output features; fed the same input on every
rank of the set, each rank computes its slice, and the input's gradient is the sum of
every rank's. A row-parallel layer keeps a slice of the input features; fed the matching
slice (the column-parallel layer's output), each rank computes a partial product, and
the partial products are summed. The pair is the Megatron-LM MLP block: one all-reduce
forward (after the row-parallel layer) and one backward (into the column-parallel one's
input). Every rank of the set must run the same layers in the same order.
"""

import torch

from ..common.reduce_ops import Sum
from ..core.process_sets import global_process_set, rank_in, size_in
from .mpi_ops import allgather, allreduce

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_set", "sum_over_set", "gather_from_set"]


def _sum(tensor: torch.Tensor, process_set) -> torch.Tensor:
    return allreduce(tensor.detach(), op=Sum, process_set=process_set)


def _gather_last(tensor: torch.Tensor, process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the last dimension, in set order."""
    return allgather(tensor.detach().movedim(-1, 0).contiguous(), process_set=process_set).movedim(0, -1)


def _my_slice(tensor: torch.Tensor, process_set) -> torch.Tensor:
    """This rank's equal slice of the last dimension."""
    what = "tensor parallelism"
    return tensor.chunk(size_in(process_set, what), dim=-1)[rank_in(process_set, what)].contiguous()


class _CopyToSet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad, ctx.process_set), None


class _SumOverSet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        return _sum(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _gather_last(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _my_slice(grad, ctx.process_set), None


def copy_to_set(tensor: torch.Tensor, process_set=global_process_set) -> torch.Tensor:
    """`tensor` itself forward; backward, the sum of every rank's gradient."""
    return _CopyToSet.apply(tensor, process_set)


def sum_over_set(tensor: torch.Tensor, process_set=global_process_set) -> torch.Tensor:
    """The sum of every rank's `tensor` forward; backward, the gradient itself."""
    return _SumOverSet.apply(tensor, process_set)


def gather_from_set(tensor: torch.Tensor, process_set=global_process_set) -> torch.Tensor:
    """Every rank's `tensor` joined along the last dimension forward; backward, this rank's slice."""
    return _GatherFromSet.apply(tensor, process_set)


def _shard_size(features: int, process_set, what: str) -> int:
    size = size_in(process_set, what)
    if features % size:
        raise ValueError(f"{what}: {features} features do not split evenly over {size} ranks")
    return features // size


class ColumnParallelLinear(torch.nn.Module):
    """`torch.nn.Linear(in_features, out_features)` whose output features are split evenly
    over the ranks of `process_set`; each rank holds `out_features / n` of them.

    Args:
        gather_output: return every rank's slice joined (the whole output) rather than this
            rank's slice (what a RowParallelLinear after it takes).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, process_set=global_process_set,
                 gather_output: bool = False, device=None, dtype=None):
        super().__init__()
        self.process_set = process_set
        self.gather_output = gather_output
        self.local = torch.nn.Linear(in_features, _shard_size(out_features, process_set, "ColumnParallelLinear"),
                                     bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, process_set=global_process_set, gather_output: bool = False):
        """This rank's share of an existing (whole) layer."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, process_set, gather_output,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            n, me = size_in(process_set, "ColumnParallelLinear"), rank_in(process_set, "ColumnParallelLinear")
            layer.local.weight.copy_(linear.weight.chunk(n, dim=0)[me])
            if linear.bias is not None:
                layer.local.bias.copy_(linear.bias.chunk(n, dim=0)[me])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.local(copy_to_set(x, self.process_set))
        return gather_from_set(out, self.process_set) if self.gather_output else out


class RowParallelLinear(torch.nn.Module):
    """`torch.nn.Linear(in_features, out_features)` whose input features are split evenly
    over the ranks of `process_set`; the partial products are summed over the set, then
    the bias (held whole on every rank) is added.

    Args:
        input_is_parallel: the input is already this rank's slice (a ColumnParallelLinear's
            output); otherwise the whole input is given and each rank takes its slice.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, process_set=global_process_set,
                 input_is_parallel: bool = True, device=None, dtype=None):
        super().__init__()
        self.process_set = process_set
        self.input_is_parallel = input_is_parallel
        self.local = torch.nn.Linear(_shard_size(in_features, process_set, "RowParallelLinear"), out_features,
                                     bias=False, device=device, dtype=dtype)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, process_set=global_process_set, input_is_parallel: bool = True):
        """This rank's share of an existing (whole) layer."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, process_set, input_is_parallel,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            layer.local.weight.copy_(_my_slice(linear.weight, process_set))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = _my_slice(copy_to_set(x, self.process_set), self.process_set)
        out = sum_over_set(self.local(x), self.process_set)
        return out + self.bias if self.bias is not None else out
