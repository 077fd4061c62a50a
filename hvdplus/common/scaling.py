"""How op, prescale and postscale become the numbers a reduction multiplies by, the same in
every layer: `postscale * op(prescale * x)` over the ranks, Average dividing by their number.
An optimizer's averaging options (gradient_predivide_factor, summed passes) become one such
reduction here too."""

from typing import NamedTuple

from .reduce_ops import Average, ReduceOp, Sum

__all__ = ["Reduction", "gradient_reduction", "scale_factor", "reducescatter_gradient_factor"]


def scale_factor(op, prescale: float, postscale: float, size: int) -> float:
    """The one number that `postscale * op(prescale * x)` over `size` ranks multiplies each
    rank's values by when they are summed: prescale * postscale, over size for Average.

    A step that applies only part of it passes 1.0 for the rest (after the sum, prescale
    1.0; Average alone, both 1.0): multiplying by 1.0 is exact, so the part comes out
    bit for bit as if computed on its own."""
    product = prescale * postscale
    return product / size if op == Average else product


class Reduction(NamedTuple):
    """`postscale * op(prescale * x)` over the ranks, as the collectives take it."""

    op: ReduceOp
    prescale: float = 1.0
    postscale: float = 1.0

    def factor(self, size: int) -> float:
        """What the reduction multiplies each rank's values by, for values that are gathered
        and summed instead of reduced (sparse gradients): Average's 1/size included."""
        return scale_factor(self.op, self.prescale, self.postscale, size)


def gradient_reduction(op, gradient_predivide_factor: float, size: int, summed_passes: int = 1) -> Reduction:
    """Horovod's `gradient_predivide_factor` f: with Average, gradients are divided by f
    before the sum and by size/f after it (f = size divides everything up front, which keeps
    half-precision sums in range); f = 1 leaves `op` as it is.

    `summed_passes` multiplies the result, for a framework whose gradient accumulation
    averages the passes where Horovod sums them."""
    if gradient_predivide_factor == 1.0:
        return Reduction(op, 1.0, float(summed_passes))
    if op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    return Reduction(Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / size * summed_passes)


def reducescatter_gradient_factor(op, prescale: float, postscale: float, size: int) -> float:
    """What the gathered upstream gradients of a reducescatter `postscale * op(prescale *
    x)` over `size` ranks are multiplied by, as Horovod's TensorFlow and torch gradients both
    take it: prescale * postscale, times size for Sum (Average's 1/size is not applied, so
    each rank's loss counts as its share of one mean). One number, applied in one
    multiplication, so that every framework's gradient is the same bit for bit."""
    factor = prescale * postscale
    return factor * size if op == Sum else factor
