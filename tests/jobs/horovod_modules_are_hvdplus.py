"""With the Horovod alias on the path, imports Horovod's modules as Horovod's programs do and
asserts that each name is hvdplus' own object; prints 'aliased'. tests/test_horovod_compat.py
runs it in a fresh interpreter."""

import horovod
import horovod.keras.callbacks
import horovod.tensorflow.keras as hk
import horovod.torch as hvd
import horovod.torch.elastic
from horovod.common.exceptions import HorovodInternalError
from horovod.torch.mpi_ops import allreduce_async_

import hvdplus.keras
import hvdplus.torch

assert hvd.__name__ == "horovod.torch" and hvd.DistributedOptimizer is hvdplus.torch.DistributedOptimizer
assert horovod.torch.elastic.TorchState is hvdplus.torch.elastic.TorchState
assert horovod.keras.callbacks.MetricAverageCallback is hvdplus.keras.callbacks.MetricAverageCallback
assert hk.DistributedOptimizer is hvdplus.keras.DistributedOptimizer
assert HorovodInternalError is hvdplus.torch.HorovodInternalError
assert allreduce_async_ is hvdplus.torch.allreduce_async_
assert horovod.__version__.startswith("0.28.1+hvdplus.")
print("aliased")
