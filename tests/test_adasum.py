"""Adasum's combination of two vectors (hvdplus.comm.adasum), in one process: the cases its
definition fixes, and the tree of four against the formula written out."""

import numpy as np

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
