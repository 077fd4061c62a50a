"""`hvd.DistributedOptimizer` of Horovod's TensorFlow API: on TensorFlow 2.16+ every
tf.keras optimizer is a Keras 3 optimizer, which hvdplus.keras wraps (its gradients are
all-reduced in `apply`, inside the training step's tf.function).

`hvdplus.keras` sits above this package (it serves TensorFlow as one of Keras' backends), so
the Horovod-compat layer above both (hvdplus.horovod_keras) hands the optimizer to it, and
`import hvdplus.tensorflow` loads no Keras."""

from ..common.reduce_ops import Average
from ..core.process_sets import global_process_set
from ..horovod_keras import wrap_keras_optimizer
from .compression import Compression

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         process_set=global_process_set):
    """Wrap a tf.keras (Keras 3) optimizer so that the gradients it applies are all-reduced.

    Horovod's argument order; `name`, `use_locking`, `device_dense` and `device_sparse` are
    accepted for it and mean nothing here. The rest are hvdplus.keras.DistributedOptimizer's,
    `process_set` included (gradients averaged over that set's ranks).
    """
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"hvdplus.tensorflow.DistributedOptimizer wraps Keras optimizers (tf.keras.optimizers.*), "
            f"not {type(optimizer).__name__}; in a custom training loop, wrap the tape in "
            "hvd.DistributedGradientTape instead"
        )
    return wrap_keras_optimizer(
        optimizer, compression=compression, op=op, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        gradient_predivide_factor=gradient_predivide_factor, sparse_as_dense=sparse_as_dense,
        process_set=process_set)
