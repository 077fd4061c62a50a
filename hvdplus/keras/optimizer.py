"""DistributedOptimizer for Keras 3: every optimizer, every backend that hvdplus bridges.

Keras 3 routes every update through `Optimizer.apply(grads, trainable_variables)` on all
backends (model.fit, custom loops, `apply_gradients`), so overriding it sees the gradients
wherever they come from. The wrapped optimizer is an instance of a subclass of the user's
optimizer class that keeps its name and configuration, so `model.save` writes the plain
optimizer and `hvdplus.keras.load_model` wraps it again.

With `process_set=`, gradients are averaged over the ranks of that set alone (disjoint sets
train replica groups of their own); as in Horovod, a rank outside the set applies its own
gradients, not reduced.

With a local sample count (`local_samples=n`, `set_local_samples(n)`, or `load_balancer=`
whose local batch size it reads), the average is weighted: sum_i(n_i g_i) / sum_i(n_i), the
gradient of the mean loss over the union of the ranks' uneven batches when each rank's loss
is the mean over its own n_i samples. The count is read when each step runs (on the host,
see backends/step_weight.py), not when Keras traces the step, so it may change every step.
"""

import contextlib
import time
import weakref

import keras

from ..common.local_layers import local_layer_variables
from ..common.mixed_classes import mixed_class
from ..common.reduce_ops import Average
from ..common.scaling import Reduction, gradient_reduction
from ..core import runtime
from ..core.load_balance import check_weighted_op, sample_count
from ..core.process_sets import ProcessSet, global_process_set, is_job
from . import backends
from .backends.step_weight import StepWeight
from .compression import Compression
from .mpi_ops import GRADIENTS_GROUP, allreduce_gradients
from .staleness import DelayedGradients, checked_staleness

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "distributed_class"]


class _DistributedOptimizer:
    """Mixed in before a Keras optimizer class."""

    _hvdplus_reduction = Reduction(Average)
    _hvdplus_compression = Compression.none
    _hvdplus_process_set = None  # the whole job
    _hvdplus_local = frozenset()  # ids of variables whose gradients stay on this rank
    _hvdplus_scale_local = True
    _hvdplus_reduced_by_caller = False
    _hvdplus_local_samples = None  # this rank's samples per step, where given
    _hvdplus_load_balancer = None
    _hvdplus_weighted = False  # whether the step's all-reduce reads a count (fixed once traced)
    _hvdplus_traced_plain = False  # whether a compiled step holds the unweighted all-reduce
    _hvdplus_paused = False  # local steps: no all-reduce (LocalSGDCallback after its warm-up)
    _hvdplus_delayed = None  # with staleness=1: the DelayedGradients in flight
    # When a step first read its count since this was cleared: its gradients are computed
    # then, before the all-reduce waits for the other ranks (LoadBalanceCallback's measure).
    _hvdplus_count_read_at = None

    def _hvdplus_configure(self, op, backward_passes_per_step, average_aggregated_gradients,
                           gradient_predivide_factor, compression=None, process_set=None, local_samples=None,
                           load_balancer=None, staleness=0):
        if local_samples is not None or load_balancer is not None:
            check_weighted_op(op, "DistributedOptimizer(local_samples=, load_balancer=)")
        self._hvdplus_local_samples, self._hvdplus_load_balancer = local_samples, load_balancer
        self._hvdplus_weighted = local_samples is not None or load_balancer is not None
        if checked_staleness(staleness, keras.backend.backend(), self._hvdplus_weighted, backward_passes_per_step):
            if compression not in (None, Compression.none):
                raise ValueError("DistributedOptimizer(staleness=1): compression of delayed gradients is not supported")
            self._hvdplus_delayed = DelayedGradients(f"{GRADIENTS_GROUP}.delayed")
        if process_set is not None and not isinstance(process_set, ProcessSet):
            raise TypeError(f"DistributedOptimizer: process_set must be an hvdplus ProcessSet, "
                            f"got {type(process_set).__name__}")
        if not is_job(process_set):
            process_set.size()  # ValueError now for a set that has not been added
        self._hvdplus_process_set = None if is_job(process_set) else process_set
        self._hvdplus_compression = compression or Compression.none
        self._hvdplus_options = (op, gradient_predivide_factor, backward_passes_per_step, average_aggregated_gradients)
        if backward_passes_per_step > 1:
            self.gradient_accumulation_steps = backward_passes_per_step
        self._hvdplus_scale_to_size()
        if "_hvdplus_detach_from_reforms" not in vars(self):
            # A job that re-forms (hvdplus.elastic) has a new size, which the scale follows.
            this = weakref.ref(self)
            self._hvdplus_detach_from_reforms = runtime.on_reform(
                lambda: this() is not None and this()._hvdplus_scale_to_size())
        backends.prepare_training(keras.backend.backend())

    def _hvdplus_size(self) -> int:
        """How many ranks average the gradients: the job's, or the process set's."""
        process_set = self._hvdplus_process_set
        return runtime.size() if process_set is None else process_set.size()

    def _hvdplus_reduces(self) -> bool:
        """Whether this rank all-reduces its gradients: with others, in its process set."""
        process_set = self._hvdplus_process_set
        return (not self._hvdplus_paused and self._hvdplus_size() > 1
                and (process_set is None or process_set.included()))

    def _hvdplus_pause(self, paused: bool) -> bool:
        """Take local steps, applying this rank's own gradients (`paused`), or all-reduce them
        again; returns whether that changed. A step compiled before holds what it traced: the
        caller has Keras make it again (model.make_train_function(force=True))."""
        changed = self._hvdplus_paused != bool(paused)
        self._hvdplus_paused = bool(paused)
        return changed

    def _hvdplus_scale_to_size(self):
        """The reduction for the size of the job or process set (gradient_predivide_factor
        divides by it)."""
        op, gradient_predivide_factor, backward_passes_per_step, average_aggregated_gradients = self._hvdplus_options
        # Keras' own accumulation averages the passes; Horovod's default sums them.
        summed = backward_passes_per_step > 1 and not average_aggregated_gradients
        summed_passes = backward_passes_per_step if summed else 1
        self._hvdplus_reduction = gradient_reduction(op, gradient_predivide_factor, self._hvdplus_size(),
                                                     summed_passes)
        # A weighted average divides by the weights' total, in float32 or wider: no predivide.
        self._hvdplus_weighted_reduction = gradient_reduction(Average, 1.0, self._hvdplus_size(), summed_passes)

    def set_local_samples(self, samples):
        """Average the gradients of the coming steps weighted by `samples`, this rank's number
        of samples in each: sum_i(n_i g_i) / sum_i(n_i). It is read when each step runs, so a
        callback's `on_train_batch_begin` may set it for every batch of `model.fit`; it holds
        until set again and takes precedence over `load_balancer=`. None goes back to the
        balancer's count where one was given, else to the plain average.

        Args:
            samples: a number of 0 or more (not 0 on every rank), checked on every rank when
                the gradients are reduced, so that a bad one raises on all of them.
        """
        if samples is not None:
            check_weighted_op(self._hvdplus_options[0], "DistributedOptimizer.set_local_samples()")
            if self._hvdplus_delayed is not None:
                raise ValueError(f"DistributedOptimizer(staleness=1).set_local_samples({samples}): weighted averages "
                                 "of delayed gradients are not supported; use staleness=0")
            if not self._hvdplus_weighted and self._hvdplus_traced_plain:
                raise RuntimeError(
                    f"DistributedOptimizer.set_local_samples({samples}): the training step was already compiled "
                    "with the plain average, which reads no count; give local_samples= (or load_balancer=) when "
                    "wrapping the optimizer, or set the count before the first step")
            self._hvdplus_weighted = True
        self._hvdplus_local_samples = samples

    def _hvdplus_count(self):
        """This step's weight: the count set, else the balancer's local batch size, else None."""
        if self._hvdplus_count_read_at is None:
            self._hvdplus_count_read_at = time.perf_counter()
        return sample_count(self._hvdplus_local_samples, self._hvdplus_load_balancer)

    def _hvdplus_step_weight(self, grads):
        """The StepWeight the backends read this step's count through (None: unweighted)."""
        if self._hvdplus_weighted:
            return StepWeight(self._hvdplus_count, self._hvdplus_weighted_reduction)
        if backends.for_backend(keras.backend.backend()).traced([g for g in grads if g is not None]):
            self._hvdplus_traced_plain = True
        return None

    def apply(self, grads, trainable_variables=None):
        if self._hvdplus_reduces() and not self._hvdplus_reduced_by_caller:
            if self._hvdplus_delayed is not None:
                grads = self._hvdplus_exchange_delayed(grads)
                if grads is None:
                    return None  # the first step: its gradients are only sent
                return super().apply(grads, trainable_variables)
            variables = trainable_variables if trainable_variables is not None else self._trainable_variables
            grads = self._hvdplus_reduced(grads, variables)
        return super().apply(grads, trainable_variables)

    def _hvdplus_exchange_delayed(self, grads):
        """With staleness=1: send this step's gradients, and return the previous step's
        averaged (None in the first step)."""
        if backends.for_backend(keras.backend.backend()).traced([g for g in grads if g is not None]):
            raise ValueError("DistributedOptimizer(staleness=1): the gradients are traced into a compiled step here "
                             "(a train_step of one's own, or keras.distribution, on jax), where the previous step's "
                             "cannot be kept; use Keras' own train_step, or staleness=0")
        return self._hvdplus_delayed.exchange(list(grads), self._hvdplus_reduction, self._hvdplus_process_set)

    def _hvdplus_reduced(self, grads, variables):
        """`grads` of `variables` as this optimizer applies them: all-reduced over the set
        (compressed on the wire), and local variables' own gradients divided by the size."""
        grads = list(grads)
        # Local variables' gradients (PartialDistributedOptimizer) skip the all-reduce.
        kept = {i: grads[i] for i, variable in enumerate(variables) if id(variable) in self._hvdplus_local}
        for i in kept:
            grads[i] = None
        op, prescale, postscale = self._hvdplus_reduction
        compression = self._hvdplus_compression
        # Without compression a gradient stays the very tensor (torch's .grad, reduced in place).
        wires = [(None, None) if g is None else compression.compress(g) for g in grads]
        reduced = allreduce_gradients([wire for wire, _ in wires], list(variables), op, prescale, postscale,
                                      self._hvdplus_process_set, self._hvdplus_step_weight(grads))
        grads = [r if r is None else compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, wires)]
        divisor = self._hvdplus_size() if self._hvdplus_scale_local else 1
        for i, grad in kept.items():
            grads[i] = grad / divisor if divisor != 1 and grad is not None else grad
        return grads

    @contextlib.contextmanager
    def _hvdplus_applying_reduced(self):
        """Within: `apply` takes its gradients as already reduced (a training step that reduced
        them itself, outside the compiled update, calls it so)."""
        self._hvdplus_reduced_by_caller = True
        try:
            yield
        finally:
            self._hvdplus_reduced_by_caller = False


def distributed_class(optimizer_class):
    """The hvdplus subclass of a Keras optimizer class (one per class, kept)."""
    return mixed_class(_DistributedOptimizer, optimizer_class)


def DistributedOptimizer(optimizer, compression=None, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, gradient_predivide_factor=1.0,
                         sparse_as_dense=False, process_set=global_process_set, local_samples=None,
                         load_balancer=None, staleness=0):
    """Wrap a Keras 3 optimizer so that the gradients it applies are all-reduced first.

    Args:
        optimizer: any keras.optimizers.Optimizer, before it has taken a step.
        compression: Compression.none (None), .fp16 or .bf16 for the gradients on the wire.
        op: Average (default) or Sum over ranks.
        backward_passes_per_step: passes accumulated (Keras' gradient_accumulation_steps)
            before the variables are updated.
        average_aggregated_gradients: divide the accumulated gradients by the passes (True)
            or sum them (False, as Horovod).
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
        sparse_as_dense: accepted for Horovod compatibility; Keras 3 hands dense gradients.
        process_set: the ranks whose gradients are averaged (the scale is from its size); the
            whole job by default. A rank outside the set applies its own gradients.
        local_samples: this rank's number of samples per step (op Average only): the
            gradients are averaged weighted by it, so that uneven local batches give the
            gradient of the mean loss over all of them. `set_local_samples(n)` changes it.
            Counts that are negative, or sum to zero, raise on every rank.
        load_balancer: an hvdplus LoadBalancer whose `local_batch_size()`, read when each
            step runs, is the count (when no count is set).
        staleness: 0 (default): each step applies its own averaged gradients. 1: step t
            applies the gradients averaged in step t-1, whose all-reduce runs behind step t's
            forward and backward; step 0 only sends its gradients. On the torch and jax
            backends, with Keras' own train_step; not with local_samples=, load_balancer=,
            compression or backward_passes_per_step > 1 (see staleness.py).
    """
    wrapped = distributed_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped._hvdplus_configure(op, backward_passes_per_step, average_aggregated_gradients,
                               gradient_predivide_factor, compression, process_set, local_samples, load_balancer,
                               staleness)
    return wrapped


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                                process_set=global_process_set, local_layers=None, scale_local_gradients=True):
    """A DistributedOptimizer that keeps the gradients of `local_layers`' trainable variables
    on each rank (divided by the number of ranks with `scale_local_gradients`), as Horovod's
    does, in Horovod's argument order; `name`, `device_dense`, `device_sparse` and `groups`
    are accepted for it."""
    local = local_layer_variables(local_layers, keras.layers.Layer, "keras.layers.Layer")
    wrapped = DistributedOptimizer(optimizer, compression, op, backward_passes_per_step, average_aggregated_gradients,
                                   gradient_predivide_factor, sparse_as_dense, process_set)
    wrapped._hvdplus_local = frozenset(id(variable) for variable in local)
    wrapped._hvdplus_scale_local = scale_local_gradients
    return wrapped
