"""hvdplus.common.scaling: op, prescale and postscale into the numbers multiplied, checked
against reductions computed by hand in numpy (no MPI needed)."""

import numpy as np
import pytest

from hvdplus.common.reduce_ops import Adasum, Average, Max, Sum
from hvdplus.common.scaling import Reduction, gradient_reduction, reducescatter_gradient_factor, scale_factor

# Four ranks' values, as float64 so that sums are exact enough to compare.
RANKS = np.array([[1.0, -2.0, 3.5], [4.0, 0.5, -1.0], [2.0, 2.0, 2.0], [-3.0, 1.5, 0.25]])
SIZE = len(RANKS)


def reduced_by_hand(op, prescale, postscale):
    """`postscale * op(prescale * x)` over RANKS, Average dividing the sum by the size."""
    total = (prescale * RANKS).sum(axis=0)
    return postscale * (total / SIZE if op == Average else total)


@pytest.mark.parametrize("op, prescale, postscale, expected", [
    (Average, 1.0, 1.0, 0.25),
    (Average, 0.5, 3.0, 0.375),
    (Sum, 1.0, 1.0, 1.0),
    (Sum, 0.5, 3.0, 1.5),
    (Max, 2.0, 1.0, 2.0),
    (Adasum, 1.0, 0.5, 0.5),
])
def test_scale_factor_by_hand(op, prescale, postscale, expected):
    assert scale_factor(op, prescale, postscale, SIZE) == expected


@pytest.mark.parametrize("op", [Average, Sum])
@pytest.mark.parametrize("prescale, postscale", [(1.0, 1.0), (0.5, 3.0), (0.125, 2.0)])
def test_scale_factor_times_the_gathered_sum_is_the_reduction(op, prescale, postscale):
    gathered_sum = RANKS.sum(axis=0)
    np.testing.assert_allclose(scale_factor(op, prescale, postscale, SIZE) * gathered_sum,
                               reduced_by_hand(op, prescale, postscale), rtol=1e-15)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 12])
@pytest.mark.parametrize("postscale", [1.0, 0.1, 3.0, 2.0 / 3.0])
def test_a_part_of_the_scaling_has_the_bits_of_that_part_alone(size, postscale):
    """The steps that apply part of the scaling get, bit for bit, what they computed on their
    own: Average and the postscale after a sum, Average alone while packing."""
    assert scale_factor(Average, 1.0, postscale, size) == postscale / size
    assert scale_factor(Sum, 1.0, postscale, size) == postscale
    assert scale_factor(Average, 1.0, 1.0, size) == 1.0 / size


def test_reduction_factor_is_scale_factor():
    assert Reduction(Average).factor(SIZE) == 0.25
    assert Reduction(Sum, 0.5, 3.0).factor(SIZE) == 1.5
    assert Reduction(Average, 0.1, 0.7).factor(3) == 0.1 * 0.7 / 3


def test_gradient_reduction_without_predivide_keeps_the_op():
    assert gradient_reduction(Average, 1.0, SIZE) == Reduction(Average, 1.0, 1.0)
    assert gradient_reduction(Sum, 1.0, SIZE) == Reduction(Sum)


@pytest.mark.parametrize("predivide", [2.0, 4.0, 8.0])
def test_predivide_splits_average_around_the_sum(predivide):
    reduction = gradient_reduction(Average, predivide, SIZE)
    assert reduction == Reduction(Sum, 1.0 / predivide, predivide / SIZE)
    np.testing.assert_allclose(reduced_by_hand(*reduction), RANKS.mean(axis=0), rtol=1e-15)
    assert reduction.factor(SIZE) == 1.0 / predivide * (predivide / SIZE)


def test_predivide_needs_average():
    with pytest.raises(ValueError, match="gradient_predivide_factor needs op=Average"):
        gradient_reduction(Sum, 2.0, SIZE)


@pytest.mark.parametrize("predivide", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("passes", [1, 2, 3])
def test_summed_passes_turn_a_mean_of_passes_into_their_sum(predivide, passes):
    """Keras hands the mean of the accumulated passes (here each rank's RANKS row, every pass
    alike); Horovod's result is the passes' sum averaged over the ranks."""
    reduction = gradient_reduction(Average, predivide, SIZE, passes)
    expected_postscale = float(passes) if predivide == 1.0 else predivide / SIZE * passes
    assert reduction.postscale == expected_postscale and type(reduction.postscale) is float
    np.testing.assert_allclose(reduced_by_hand(*reduction), passes * RANKS.mean(axis=0), rtol=1e-15)


@pytest.mark.parametrize("op, prescale, postscale, expected", [
    (Average, 1.0, 1.0, 1.0),
    (Average, 0.5, 3.0, 1.5),
    (Sum, 1.0, 1.0, 4.0),
    (Sum, 0.5, 3.0, 6.0),
])
def test_reducescatter_gradient_factor_is_horovods(op, prescale, postscale, expected):
    # Horovod's TensorFlow and torch gradients: the gathered gradients times both scale
    # factors and, for Sum, the size; Average's 1/size is left out.
    assert reducescatter_gradient_factor(op, prescale, postscale, SIZE) == expected
