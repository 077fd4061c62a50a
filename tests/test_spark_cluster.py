"""hvdplus.spark.run on a local Spark cluster (`local-cluster[2,1,1024]`): a master, two workers and
an executor each, separate JVMs with Python workers of their own, as on a real cluster. The ranks'
return values, a collective checked against numpy, and a torch DistributedOptimizer equal to one
process."""

import sys

import cloudpickle
import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from pyspark import cloudpickle as spark_cloudpickle  # noqa: E402 (after the check for pyspark)

import hvdplus.spark  # noqa: E402
from testkit import torch_shards  # noqa: E402
from testkit.processes import assert_all_end  # noqa: E402
from testkit.spark_session import local_session  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    session = local_session("local-cluster[2,1,1024]", **{"spark.executor.memory": "512m"})
    yield session
    session.stop()


def ranks_and_sums():
    import os

    import numpy as np

    import hvdplus as hvd
    hvd.init()
    return hvd.rank(), hvd.size(), os.getpid(), hvd.allreduce(np.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum)


def test_ranks_in_two_executors_return_in_rank_order_and_torch_trains_like_one_process(spark):
    results = hvdplus.spark.run(ranks_and_sums, num_proc=2, start_timeout=120)
    assert [(rank, size) for rank, size, _, _ in results] == [(0, 2), (1, 2)]
    for _, _, _, total in results:
        np.testing.assert_array_equal(total, 3.0 * np.arange(4.0))
    assert_all_end([pid for _, _, pid, _ in results])

    torch_shards.register_by_value(cloudpickle, spark_cloudpickle)
    trained = hvdplus.spark.run(torch_shards.train_on_shards, args=(torch_shards.model, torch_shards.batches()),
                                num_proc=2, start_timeout=120)
    torch_shards.assert_trains_like_one_process(trained, torch_shards.model, torch_shards.batches())
