"""`import hvdplus.keras as hvd`: data-parallel Keras 3 `model.fit` on the tensorflow, torch and
jax backends.

    hvd.init()                                   # also silences Keras output on ranks > 0
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=optimizer, loss=...)
    model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()])
"""

import keras

from ..core import process_sets as _process_sets
from ..core import runtime as _runtime
from ..core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from ..core.basics import Average
from ..core.basics import __all__ as _BASICS
from ..core.load_balance import LoadBalancer
from . import callbacks, elastic
from .balanced_dataset import BalancedPyDataset
from .compression import Compression
from .mpi_ops import allgather, allgather_object, allreduce, broadcast, broadcast_object, reducescatter
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, distributed_class

__all__ = [
    *_BASICS,
    "callbacks", "elastic", "LoadBalancer", "BalancedPyDataset", "Compression", "allgather", "allgather_object",
    "allreduce", "broadcast",
    "broadcast_object", "reducescatter", "DistributedOptimizer", "PartialDistributedOptimizer",
    "broadcast_global_variables", "verbose", "load_model",
]


def init(comm=None, process_sets=None, quiet_other_ranks=True):
    """Start hvdplus (see hvdplus.init). With `quiet_other_ranks`, Keras' progress bars and
    logs are switched off on every rank but 0, so `model.fit(verbose=1)` prints once; the
    explicit idiom `verbose=1 if hvd.rank() == 0 else 0` works too."""
    _process_sets.init(comm, process_sets)
    if quiet_other_ranks and _runtime.is_initialized() and _runtime.rank() != 0:
        keras.utils.disable_interactive_logging()


def broadcast_global_variables(root_rank):
    """Horovod's TF1-era call: Keras 3 has no global variables, so it raises, as Horovod's does
    under TensorFlow 2. Use BroadcastGlobalVariablesCallback."""
    raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                       "Please use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) in model.fit "
                       "(or hvdplus.tensorflow.broadcast_variables(<model/optimizer variables>)) instead.")


def verbose(level=1):
    """`level` on rank 0, 0 elsewhere: `model.fit(..., verbose=hvd.verbose())`."""
    return level if _runtime.rank() == 0 else 0


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None, compile=True,
               op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
               gradient_predivide_factor=1.0):
    """keras.saving.load_model, with the saved optimizer (state included) loaded straight into
    its DistributedOptimizer class: any of keras.optimizers, or of `custom_optimizers` (your
    own Optimizer subclasses). The first four arguments are Horovod's; the options after
    `compile` are DistributedOptimizer's."""
    classes = [cls for cls in vars(keras.optimizers).values()
               if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)
               and cls is not keras.optimizers.Optimizer]
    objects = {cls.__name__: distributed_class(cls) for cls in classes + list(custom_optimizers or [])}
    objects.update(custom_objects or {})
    model = keras.saving.load_model(filepath, custom_objects=objects, compile=compile)
    optimizer = getattr(model, "optimizer", None)
    if compile and optimizer is not None and hasattr(optimizer, "_hvdplus_configure"):
        optimizer._hvdplus_configure(op, backward_passes_per_step, average_aggregated_gradients,
                                     gradient_predivide_factor, compression)
    return model
