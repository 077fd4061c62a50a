"""DistributedGradientTape: `gradient()` returns gradients averaged over all ranks.

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

All gradients of one `gradient()` call go to the engine together, in one host op: the
dense ones as one fused group, the IndexedSlices (embeddings, tf.gather) as allgathers, or
densified first with sparse_as_dense=True. Eagerly every call uses the same name, so after
the first step the engine's response cache knows it; in a tf.function the op is named
when traced. Gradients that are None (variables the loss does not use) stay None and are
not sent: every rank must have the same ones.

With a local sample count (`local_samples=n`, or `load_balancer=` whose local batch size it
reads when `gradient()` runs), the average is weighted: sum_i(n_i g_i) / sum_i(n_i), the
gradient of the mean loss over the union of the ranks' uneven batches when each rank's loss
is the mean over its own n_i samples.

With `process_set=`, gradients are averaged over the ranks of that set alone (several
disjoint sets can each train a replica group of their own); as in Horovod, a rank outside
the set gets its own gradients back, not reduced.
"""

import tensorflow as tf

from ..common.local_layers import local_layer_variables
from ..common.reduce_ops import Average, Sum, as_reduce_op
from ..common.scaling import gradient_reduction
from ..common.sparse import densified
from ..core.load_balance import check_weighted_op, sample_count
from ..core.process_sets import ProcessSet, global_process_set, size_in
from .compression import Compression
from .mpi_ops import grouped_allreduce

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


def _source_key(source):
    """A hashable key for a variable: tf.Variable's ref(), or the identity of a Keras 3 Variable."""
    return source.ref() if hasattr(source, "ref") else id(source)


def _outside(process_set) -> bool:
    """Whether `process_set` is an added set that does not include this rank."""
    return isinstance(process_set, ProcessSet) and process_set.process_set_id != 0 and not process_set.included()


class _DistributedGradientTape:
    """Mixed in before the wrapped tape's class, so the result is still that kind of tape."""

    def _hvdplus_setup(self, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                       scale_local_gradients=True, local_samples=None, load_balancer=None):
        op = as_reduce_op(op)
        if op not in (Average, Sum):
            raise ValueError(f"DistributedGradientTape takes op Average or Sum, got {op.label}")
        if local_samples is not None or load_balancer is not None:
            check_weighted_op(op, "DistributedGradientTape(local_samples=, load_balancer=)")
        self._local_samples, self._load_balancer = local_samples, load_balancer
        # Outside the set there is nothing to reduce with (Horovod's tape leaves such a rank's
        # gradients as they are); inside it, Average and the predivide factor use its size.
        self._process_set = process_set
        self._reduces = not _outside(process_set)
        if self._reduces:
            self._size = size_in(process_set, "DistributedGradientTape")
            self._reduction = gradient_reduction(op, gradient_predivide_factor, self._size)
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._local_sources = set()
        self._scale_local_gradients = scale_local_gradients

    def register_local_source(self, source):
        """Keep `source`'s gradient on this rank, not reduced (divided by the set's size when
        the tape scales local gradients), as Horovod's tape does."""
        self._local_sources.add(_source_key(source))

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients, all-reduced over every rank of the process set; same
        structure as `sources`."""
        return self._allreduced(super().gradient(target, sources, output_gradients, unconnected_gradients), sources)

    def _allreduced(self, gradients, sources):
        """`gradients` of `sources` (any one structure) reduced as `gradient()` reduces its own:
        for optimizers that compute their gradients themselves (tf_keras', tf.compat.v1's)."""
        if not self._reduces:
            return gradients
        flat = tf.nest.flatten(gradients)
        local = self._local_indices(sources, len(flat))
        present = [index for index, grad in enumerate(flat) if grad is not None and index not in local]
        for index in local:
            flat[index] = self._scaled_local(flat[index])
        if not present:
            return tf.nest.pack_sequence_as(gradients, flat)
        grads = [flat[index] for index in present]
        grads = densified(grads, self._sparse_as_dense, tf.IndexedSlices, tf.convert_to_tensor)
        op, prescale, postscale = self._reduction
        name = "DistributedGradientTape" if tf.executing_eagerly() else None
        weight = self._weight()
        if weight is not None:  # weighted sums run in float32 or wider: no predivide is needed
            op, prescale, postscale = Average, 1.0, 1.0
        reduced = grouped_allreduce(grads, compression=self._compression, op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, name=name, process_set=self._process_set,
                                    weight=weight)
        for index, grad in zip(present, reduced):
            flat[index] = grad
        return tf.nest.pack_sequence_as(gradients, flat)

    def _weight(self):
        """This step's weight: the count given, else the balancer's local batch size, else None."""
        return sample_count(self._local_samples, self._load_balancer)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """`gradient()`'s gradients split as Horovod's tape splits them: the (source,
        gradient) pairs of the sources registered as local, then those of the others."""
        gradients = tf.nest.flatten(self.gradient(target, sources, output_gradients))
        pairs = list(zip(tf.nest.flatten(sources), gradients))
        local = [pair for pair in pairs if _source_key(pair[0]) in self._local_sources]
        return local, [pair for pair in pairs if _source_key(pair[0]) not in self._local_sources]

    def _local_indices(self, sources, count):
        if not self._local_sources:
            return set()
        flat_sources = tf.nest.flatten(sources)
        return {index for index, source in enumerate(flat_sources[:count])
                if _source_key(source) in self._local_sources}

    def _scaled_local(self, grad):
        if grad is None or not self._scale_local_gradients:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / self._size, grad.indices, grad.dense_shape)
        return grad / self._size


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True,
                            local_samples=None, load_balancer=None):
    """Wrap `gradtape` (recorded or not yet entered) so that `gradient()` all-reduces;
    arguments in Horovod's order, then hvdplus's.

    Args:
        gradtape: a tf.GradientTape; what it recorded, and whether it is persistent, carry over.
        device_dense: accepted for Horovod's signature; hvdplus reduces on the host.
        device_sparse: likewise.
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        sparse_as_dense: densify IndexedSlices gradients instead of allgathering them.
        op: Average (default) or Sum over ranks.
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after
            (IndexedSlices gradients then raise NotImplementedError, as in Horovod: pass
            sparse_as_dense=True).
        num_groups: accepted for Horovod's signature; one `gradient()` call's gradients always
            go to the engine as one group.
        groups: likewise.
        process_set: the ranks whose gradients are averaged (size is the set's); the whole
            job by default. On a rank outside the set, `gradient()` is the wrapped tape's.
        scale_local_gradients: divide the gradients of sources registered as local
            (`register_local_source`, PartialDistributedGradientTape) by the set's size.
        local_samples: this rank's number of samples behind the gradients (a number or scalar
            tensor of 0 or more; op Average only): they are averaged weighted by it, so uneven
            local batches give the gradient of the mean loss over all of them. Counts that sum
            to zero raise on every rank.
        load_balancer: an hvdplus LoadBalancer whose `local_batch_size()`, read when
            `gradient()` runs, is the count (when `local_samples` is not given).
    """
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(gradtape.__dict__)
    wrapped._hvdplus_setup(compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                           scale_local_gradients, local_samples, load_balancer)
    return wrapped


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape that keeps the gradients of `local_layers`' trainable
    variables on each rank (divided by the set's size with `scale_local_gradients`), as
    Horovod's does: for layers each rank trains on its own."""
    local = local_layer_variables(local_layers, tf.keras.layers.Layer, "tf.keras.layers.Layer")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in local:
        tape.register_local_source(variable)
    return tape
