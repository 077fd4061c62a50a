"""`import hvdplus.tensorflow.keras as hvd` where `tf.keras` is tf_keras (Keras 2): under
`TF_USE_LEGACY_KERAS=1` with `tf-keras` installed, the Keras that Horovod's programs were
written for.

    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.001 * hvd.size()))
    model.compile(loss=..., optimizer=opt, experimental_run_tf_function=False)
    model.fit(dataset, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                  hvd.callbacks.MetricAverageCallback()])

`hvdplus.tensorflow.keras` is this package or `hvdplus.keras` (Keras 3), after what
`tf.keras` is when it is first imported.
"""

import tf_keras

from ...core import process_sets as _process_sets
from ...core import runtime as _runtime
from ...core.basics import *  # noqa: F401,F403 (init, rank, size, reduce ops, errors, build queries)
from ...core.basics import __all__ as _BASICS
from .. import functions as _functions
from ..compression import Compression
from . import callbacks, elastic
from .mpi_ops import allgather, allgather_object, allreduce, broadcast, broadcast_object, reducescatter
from .mpi_ops import evaluated as _evaluated
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, distributed_class, optimizer_classes

__all__ = [
    *_BASICS,
    "callbacks", "elastic", "Compression", "allgather", "allgather_object", "allreduce", "broadcast",
    "broadcast_object", "reducescatter", "DistributedOptimizer", "PartialDistributedOptimizer",
    "broadcast_global_variables", "verbose", "load_model",
]


def init(comm=None, process_sets=None, quiet_other_ranks=True):
    """Start hvdplus (see hvdplus.init). With `quiet_other_ranks`, Keras' progress bars are
    switched off on every rank but 0, so `model.fit(verbose=1)` prints once."""
    _process_sets.init(comm, process_sets)
    if quiet_other_ranks and _runtime.is_initialized() and _runtime.rank() != 0:
        tf_keras.utils.disable_interactive_logging()


def broadcast_global_variables(root_rank):
    """Give every rank `root_rank`'s global variables, in a tf.compat.v1 graph run by Keras'
    session; eagerly there are none, and it raises Horovod's RuntimeError. Use
    BroadcastGlobalVariablesCallback in model.fit."""
    return _evaluated(_functions.broadcast_global_variables(root_rank))


def verbose(level=1):
    """`level` on rank 0, 0 elsewhere: `model.fit(..., verbose=hvd.verbose())`."""
    return level if _runtime.rank() == 0 else 0


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """`tf.keras.models.load_model`, with the saved optimizer (its state included) loaded
    into its DistributedOptimizer class: any of `tf.keras.optimizers` (of
    `tf.keras.optimizers.legacy` with `legacy_opts=True`), or of `custom_optimizers`.
    Horovod's arguments."""
    classes = optimizer_classes(legacy_opts) + list(custom_optimizers or [])
    objects = {name: distributed_class(cls) for cls in classes for name in (cls.__name__, cls.__name__.lower())}
    objects.update(custom_objects or {})
    model = tf_keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and hasattr(optimizer, "_hvdplus_tape_options"):
        optimizer._hvdplus_tape_options = dict(compression=compression)
    return model
