"""How an optimizer's averaging options become one reduction, the same in every adapter."""

from typing import NamedTuple

from .reduce_ops import Average, ReduceOp, Sum

__all__ = ["Reduction", "gradient_reduction"]


class Reduction(NamedTuple):
    """`postscale * op(prescale * x)` over the ranks, as the collectives take it."""

    op: ReduceOp
    prescale: float = 1.0
    postscale: float = 1.0

    def factor(self, size: int) -> float:
        """What the reduction multiplies each rank's values by, for values that are gathered
        and summed instead of reduced (sparse gradients): Average's 1/size included."""
        return self.prescale * self.postscale / (size if self.op == Average else 1)


def gradient_reduction(op, gradient_predivide_factor: float, size: int) -> Reduction:
    """Horovod's `gradient_predivide_factor` f: with Average, gradients are divided by f
    before the sum and by size/f after it (f = size divides everything up front, which keeps
    half-precision sums in range); f = 1 leaves `op` as it is."""
    if gradient_predivide_factor == 1.0:
        return Reduction(op)
    if op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    return Reduction(Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / size)
