"""hvd.CrossDeviceOps: tf.distribute.MirroredStrategy across processes (hybrid data parallelism).

    strategy = tf.distribute.MirroredStrategy(cross_device_ops=hvd.CrossDeviceOps())
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset)          # each process on its own shard

MirroredStrategy runs one replica per device of this process; a reduction through these
ops adds up the replicas' values on one of this process' devices, all-reduces that across
processes with hvdplus, and copies the result to every destination device.

Scaling: MirroredStrategy's num_replicas_in_sync counts this process' devices only, and
Keras divides each replica's loss by it before it SUMs the replicas' gradients. That local
sum is this process' mean gradient, and the job's mean gradient is the *average* of those
over processes: a SUM is a sum over this process' replicas and then `op` across processes,
Average by default (a sum there would make every gradient size() times too large, alike
on every process, so that only a comparison with one process shows it). MEAN is a mean
locally and an average across processes. Pass op=Sum for values that were not scaled so.

broadcast gives every process root_rank's value: MirroredStrategy broadcasts, for example,
the updates of variables aggregated ONLY_FIRST_REPLICA, such as Keras' iteration counter (a
small collective each step), so the first replica of the job decides for all.

Where TensorFlow 2.21's MirroredStrategy does not call these ops:
- CrossDeviceOps.reduce and batch_reduce skip the implementation when there is one
  between-graph worker and the value has one replica; these ops report size() workers, so
  with more than one process they are always called, one device per process included.
- strategy.reduce and extended.reduce_to to a CPU destination, or to devices other than the
  value's, use TensorFlow's ReductionToOneDevice: the result stays within the process. Keras'
  gradients (ReplicaContext.all_reduce, extended.batch_reduce_to) come here; the metrics
  model.fit reports are this process' own.
- int32 values go to ReductionToOneDevice; under XLA on GPUs its own collective ops run.
"""

import tensorflow as tf

# The helpers TensorFlow's own CrossDeviceOps use to place values and build Mirrored results.
from tensorflow.python.distribute import cross_device_ops as tf_cross_device_ops
from tensorflow.python.distribute import cross_device_utils

from ..common.reduce_ops import Average, as_reduce_op
from ..common.sparse import densified
from ..core import runtime
from .compression import Compression
from .mpi_ops import broadcast, grouped_allreduce

__all__ = ["CrossDeviceOps"]


class CrossDeviceOps(tf.distribute.CrossDeviceOps):
    """Reduces over this process' replicas, then over all processes through hvdplus.

    Args:
        op: how SUM reductions combine the processes' sums: Average (default, see above) or Sum.
        compression: Compression.none, .fp16 or .bf16 for values crossing processes.
        sparse_as_dense: densify IndexedSlices instead of allgathering them.
        root_rank: the process whose value `broadcast` gives every process.
    """

    def __init__(self, op=Average, compression=Compression.none, sparse_as_dense=False, root_rank=0):
        super().__init__()
        self._op = as_reduce_op(op)
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._root_rank = root_rank

    @property
    def _num_between_graph_workers(self):
        # More than one makes reduce and batch_reduce call the implementations for a value
        # with a single replica too.
        return runtime.size()

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self.batch_reduce_implementation(reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        """All values in one host op, so that the engine fuses them."""
        local = [self._reduce_locally(reduce_op, value, destinations)
                 for value, destinations in value_destination_pairs]
        local = densified(local, self._sparse_as_dense, tf.IndexedSlices, tf.convert_to_tensor)
        op = Average if reduce_op == tf.distribute.ReduceOp.MEAN else self._op
        # Eagerly one name for every call, which the engine's response cache then knows.
        name = "CrossDeviceOps.batch_reduce" if tf.executing_eagerly() else None
        reduced = grouped_allreduce(local, op=op, compression=self._compression, name=name)
        return [self._mirror(value, destinations) for value, (_, destinations) in zip(reduced, value_destination_pairs)]

    def broadcast_implementation(self, tensor, destinations):
        """`root_rank`'s `tensor` on every destination device of every process."""
        return self._mirror(broadcast(tensor, self._root_rank), destinations)

    def _reduce_locally(self, reduce_op, value, destinations):
        """Sum (or mean) of this process' replicas of `value`, on the first destination device."""
        device = tf_cross_device_ops.get_devices_from(destinations, self._canonicalize_devices)[0]
        replicas = value.values
        with tf.device(device):
            total = cross_device_utils.aggregate_tensors_or_indexed_slices(replicas)
            if reduce_op == tf.distribute.ReduceOp.MEAN:
                total = cross_device_utils.divide_by_n_tensors_or_indexed_slices(total, len(replicas))
        return total

    def _mirror(self, value, destinations):
        return tf_cross_device_ops.simple_broadcast(value, destinations, always_mirrored=True,
                                                    canonicalize_devices=self._canonicalize_devices)
