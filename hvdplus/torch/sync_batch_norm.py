"""SyncBatchNorm: batch normalization whose batch statistics cover every rank's rows.

In training, each rank normalizes its own rows with the mean and variance of the global
batch (all ranks' rows together, local batch sizes may differ and may be zero). Forward
costs one Sum all-reduce of per-channel [sum, sum of squares, count]; backward one Sum
all-reduce of the per-channel [sum of grad_out, sum of grad_out * (x - mean)]. Every rank
must therefore run forward and backward of the layer the same number of times and in the
same order as the others, including a rank whose batch is empty.

Weight and bias gradients are this rank's share; summed (or averaged, as
`DistributedOptimizer` does) over ranks they are the gradients of the whole batch.
In eval mode with running statistics, the layer is a plain local batch norm. With
`process_set=`, the batch is that set's ranks' rows, and only they run the collectives.
"""

import torch

from ..common.reduce_ops import Sum
from ..core.process_sets import global_process_set, size_in
from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]

_STATISTICS = torch.float64


def _channel_dims(tensor):
    """Every dimension but the channel one (1)."""
    return [0, *range(2, tensor.dim())]


def _per_channel(values, tensor):
    """Per-channel `values` shaped to broadcast against `tensor` (N, C, ...)."""
    return values.view(1, -1, *([1] * (tensor.dim() - 2)))


def _compute_dtype(dtype):
    """Elementwise work is done in at least float32, so half inputs do not lose range."""
    return torch.promote_types(dtype, torch.float32)


def _global_moments(input, process_set):
    """(mean, biased variance, count) per channel over every rank's rows, in float64."""
    wide = input.to(_STATISTICS)
    dims = _channel_dims(input)
    rows = input.numel() // input.shape[1]
    local = torch.stack([
        wide.sum(dims),
        (wide * wide).sum(dims),
        torch.full((input.shape[1],), float(rows), dtype=_STATISTICS),
    ])
    total_sum, total_squares, counts = allreduce(local, op=Sum, process_set=process_set).unbind(0)
    count = counts[0].item()
    if count < 2:
        raise ValueError(
            f"SyncBatchNorm in training got {int(count)} value(s) per channel over all ranks; "
            "batch statistics need more than 1 (this rank had "
            f"{rows}, input shape {tuple(input.shape)})"
        )
    mean = total_sum / count
    variance = (total_squares / count - mean * mean).clamp_(min=0.0)
    return mean, variance, count


class _SyncBatchNormFunction(torch.autograd.Function):
    """Returns (output, global mean, unbiased global variance); only output has a gradient."""

    @staticmethod
    def forward(ctx, input, weight, bias, eps, process_set=global_process_set):
        mean, variance, count = _global_moments(input, process_set)
        invstd = torch.rsqrt(variance + eps)
        scale = invstd if weight is None else invstd * weight.to(_STATISTICS)
        shift = -mean * scale if bias is None else bias.to(_STATISTICS) - mean * scale
        work = _compute_dtype(input.dtype)
        output = input.to(work) * _per_channel(scale.to(work), input) + _per_channel(shift.to(work), input)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.count, ctx.process_set = count, process_set
        ctx.bias_dtype = None if bias is None else bias.dtype
        unbiased = variance * (count / (count - 1))
        ctx.mark_non_differentiable(mean, unbiased)
        return output.to(input.dtype), mean, unbiased

    @staticmethod
    def backward(ctx, grad_output, _grad_mean, _grad_variance):
        input, weight, mean, invstd = ctx.saved_tensors
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        work = _compute_dtype(input.dtype)
        dims = _channel_dims(input)
        grad = grad_output.to(work)
        centered = input.to(work) - _per_channel(mean.to(work), input)
        grad_sum = grad.sum(dims, dtype=_STATISTICS)
        grad_dot_centered = (grad * centered).sum(dims, dtype=_STATISTICS)

        grad_input = grad_weight = grad_bias = None
        if needs_weight:
            grad_weight = (grad_dot_centered * invstd).to(weight.dtype)
        if needs_bias:
            grad_bias = grad_sum.to(ctx.bias_dtype)
        if needs_input:
            # Depends on input.requires_grad only, which every rank's model shares, so
            # either every rank runs this collective or none does.
            stacked = torch.stack([grad_sum, grad_dot_centered])
            total_sum, total_dot = allreduce(stacked, op=Sum, process_set=ctx.process_set).unbind(0)
            gain = invstd if weight is None else invstd * weight.to(_STATISTICS)
            mean_grad = total_sum / ctx.count
            centered_coefficient = invstd * invstd * total_dot / ctx.count
            grad_input = (
                grad
                - _per_channel(mean_grad.to(work), input)
                - centered * _per_channel(centered_coefficient.to(work), input)
            ) * _per_channel(gain.to(work), input)
            grad_input = grad_input.to(input.dtype)
        return grad_input, grad_weight, grad_bias, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization over the global batch of all ranks, for inputs (N, C, ...).

    Args:
        num_features: C, the number of channels.
        eps: added to the variance before its square root.
        momentum: weight of the newest batch in the running statistics; None for a
            cumulative average over all batches seen.
        affine: learn a per-channel weight and bias.
        track_running_stats: keep running mean and variance, used in eval mode.
        process_set: the ranks whose rows make up the batch (default: every rank).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2 or input.shape[1] != self.num_features:
            raise ValueError(
                f"SyncBatchNorm({self.num_features}) expects an input of shape (N, {self.num_features}, ...), "
                f"got shape {tuple(input.shape)}"
            )

    def _uses_batch_statistics(self) -> bool:
        return self.training or (self.running_mean is None and self.running_var is None)

    def forward(self, input):
        self._check_input_dim(input)
        if not self._uses_batch_statistics() or size_in(self.process_set, "SyncBatchNorm") == 1:
            return super().forward(input)
        output, mean, unbiased_variance = _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.eps,
                                                                        self.process_set)
        if self.training and self.track_running_stats:
            self._update_running_statistics(mean, unbiased_variance)
        return output

    @torch.no_grad()
    def _update_running_statistics(self, mean, unbiased_variance):
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased_variance.to(self.running_var.dtype), factor)
