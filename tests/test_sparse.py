"""hvdplus.common.sparse: which gradients are gathered, which made dense, and how a gather
stands for Average, checked against numpy by hand (no MPI needed)."""

import numpy as np
import pytest

from hvdplus.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from hvdplus.common.sparse import GATHERED_OPS, densified, divides_gathered, gathered


class Rows:
    """A stand-in for a framework's sparse gradient: some rows of a (4, 2) table."""

    def __init__(self, indices, values):
        self.indices, self.values = np.asarray(indices), np.asarray(values, dtype=np.float64)

    def dense(self):
        table = np.zeros((4, 2))
        np.add.at(table, self.indices, self.values)
        return table


@pytest.mark.parametrize("is_sparse, sparse_as_dense, expected", [
    (False, False, False), (False, True, False), (True, False, True), (True, True, False),
])
def test_gathered_only_sparse_gradients_not_asked_dense(is_sparse, sparse_as_dense, expected):
    assert gathered(is_sparse, sparse_as_dense) is expected


def test_densified_leaves_the_list_itself_when_sparse_ones_are_gathered():
    gradients = [Rows([0], [[1.0, 2.0]]), np.ones((4, 2))]
    assert densified(gradients, False, Rows, Rows.dense) is gradients


def test_densified_makes_only_the_sparse_ones_dense():
    dense = np.ones((4, 2))
    result = densified([Rows([0, 2, 0], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), dense], True, Rows, Rows.dense)
    np.testing.assert_array_equal(result[0], [[6.0, 8.0], [0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    assert result[1] is dense


def test_only_sum_and_average_are_gathered():
    assert set(GATHERED_OPS) == {Average, Sum}
    for op in (Adasum, Min, Max, Product):
        assert op not in GATHERED_OPS


@pytest.mark.parametrize("op", [Average, Sum])
def test_a_gather_stands_for_the_dense_reduction(op):
    """Three ranks' rows gathered (repeats summed when made dense), then divided by the
    number of ranks where divides_gathered says so, equal the dense reduction."""
    ranks = [Rows([1], [[1.0, 2.0]]), Rows([1, 3], [[0.5, 0.5], [4.0, -4.0]]), Rows([0], [[3.0, 6.0]])]
    gathered_rows = Rows(np.concatenate([r.indices for r in ranks]), np.concatenate([r.values for r in ranks]))
    values = gathered_rows.values / len(ranks) if divides_gathered(op) else gathered_rows.values
    dense_sum = sum(r.dense() for r in ranks)
    expected = dense_sum / len(ranks) if op == Average else dense_sum
    np.testing.assert_allclose(Rows(gathered_rows.indices, values).dense(), expected, rtol=1e-15)
    assert divides_gathered(op) is (op == Average)
