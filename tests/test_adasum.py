"""Adasum's combination of two vectors (hvdplus.comm.adasum), in one process: the cases its
definition fixes, the tree of four against the formula written out, and vectors of any
magnitude against the formula in exact arithmetic."""

from fractions import Fraction

import numpy as np
import pytest

from hvdplus.comm.adasum import adasum_pair, adasum_tree


def test_orthogonal_vectors_add_and_equal_vectors_average():
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    np.testing.assert_allclose(adasum_pair(a, b), a + b)
    np.testing.assert_allclose(adasum_pair(a, a), a)


def test_a_zero_vector_leaves_the_other_unchanged():
    b = np.array([0.5, -1.0], np.float32)
    result = adasum_pair(np.zeros(2, np.float32), b)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, b)


def test_four_vectors_combine_as_a_binary_tree():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((4, 6))

    def formula(a, b):
        dot = float(a @ b)
        return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b

    np.testing.assert_allclose(adasum_tree(rows), formula(formula(rows[0], rows[1]), formula(rows[2], rows[3])))


def exact_adasum(a, b):
    """The formula in exact rational arithmetic, rounded to float64 at the end: a reference
    that neither underflows nor overflows."""
    a, b = [Fraction(float(x)) for x in a], [Fraction(float(x)) for x in b]
    dot = sum(x * y for x, y in zip(a, b))
    a_norm, b_norm = sum(x * x for x in a), sum(y * y for y in b)
    a_coefficient = 1 - dot / (2 * a_norm) if a_norm else 1
    b_coefficient = 1 - dot / (2 * b_norm) if b_norm else 1
    return np.array([float(a_coefficient * x + b_coefficient * y) for x, y in zip(a, b)])


@pytest.mark.parametrize("dtype, a_scale, b_scale", [
    ("float32", 1e-30, 1e-30), ("float64", 1e-300, 1e-300), ("float16", 1e-4, 1e-4), ("float32", 1e-38, 1e-38),
    ("float64", 1e-300, 1e300), ("float64", 5e-324, 1.0), ("float32", 1e30, 1e30)],
    ids=lambda value: value if isinstance(value, str) else f"{value:g}")
def test_nearly_parallel_vectors_of_any_magnitude_combine_exactly(dtype, a_scale, b_scale):
    # Squares below the dtype's smallest number (below float64's at 1e-300) or above its
    # largest, and a and b of magnitudes far apart; the result rounds once, to the dtype.
    rng = np.random.default_rng(3)
    direction = rng.uniform(0.5, 1.0, 6) * rng.choice([-1, 1], 6)
    a = (direction * a_scale).astype(dtype)
    b = ((direction + 0.01 * rng.standard_normal(6)) * b_scale).astype(dtype)
    expected = exact_adasum(a, b)
    result = adasum_pair(a, b)
    assert result.dtype == dtype
    tiny = np.finfo(dtype).smallest_subnormal
    np.testing.assert_allclose(result.astype(np.float64), expected, rtol=4 * np.finfo(dtype).eps, atol=tiny)
