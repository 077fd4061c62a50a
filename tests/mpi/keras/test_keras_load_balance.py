"""hvdplus.keras.allreduce(weight=) on real ranks, once per Keras backend: the weighted average of
uneven batches' values against numpy, and a weight with another op raising on every rank."""

import numpy as np
import pytest

import keras
import hvdplus.keras as hvd

from testkit.weighted_reference import counts, numpy_weighted_average, values_of

hvd.init()


def test_weighted_allreduce_equals_numpy():
    rank, size = hvd.rank(), hvd.size()
    weights = counts(size)
    expected = numpy_weighted_average([values_of(r) for r in range(size)], weights)
    result = hvd.allreduce(keras.ops.convert_to_tensor(values_of(rank).astype("float32")), op=hvd.Average,
                           weight=keras.ops.convert_to_tensor(float(weights[rank])), name="weighted.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(result), expected, rtol=1e-6, atol=1e-6)


def test_a_weight_with_another_op_raises_on_every_rank_naming_the_tensor():
    with pytest.raises(ValueError, match=r"'weighted\.keras\.sum'.*op=Average"):
        hvd.allreduce(np.ones(3, "float32"), op=hvd.Sum, weight=1.0, name="weighted.keras.sum")
