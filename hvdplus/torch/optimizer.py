"""DistributedOptimizer: all-reduce each gradient the moment backward produces it.

A hook on every parameter (`register_post_accumulate_grad_hook`) marks its gradient ready
as soon as it is accumulated; once every gradient of a fusion group is ready, the group's
async all-reduce is submitted, so communication overlaps the rest of backward. Without
explicit `groups`, the groups are made here: where the engine has a core of its own, of
about `_OVERLAP_GROUP_BYTES` in the order backward finishes them; where it has none (every
core trains), one per dtype and device, since the engine waits for step() anyway and one
request per step costs least: every request pays its own negotiation and bookkeeping, and
none would start any earlier. `step()` waits for them all, then lets the wrapped optimizer
update the parameters.

With a local sample count (`set_local_samples(n)`, or `load_balancer=` whose local batch size
it reads), each gradient's all-reduce is the weighted average sum_i(n_i g_i) / sum_i(n_i):
the gradient of the mean loss over the union of the ranks' uneven batches when each rank's
loss is the mean over its own n_i samples. The count is read when the step's first gradient
is submitted, during backward, so it is set before `loss.backward()`.

With `process_set=`, gradients are averaged over that set's ranks only, on its engine; as in
Horovod, a rank outside the set applies its own gradients unreduced. A job that re-forms
(hvdplus.elastic) has no process sets any more: such an optimizer then refuses to step.

With `staleness=1` (bounded staleness, one-step-delayed SGD), the hooks all-reduce a copy of
each gradient, and step t applies the gradients averaged in step t-1 while step t's all-reduces
run on behind the next forward and backward; step 0 applies nothing. Two steps' all-reduces are
in flight at once, so their names carry the step's parity. The rules are in
`_DistributedOptimizer.synchronize` and docs/training-regimes.md.
"""

import contextlib
import warnings
import weakref

import numpy as np
import torch

from ..common.errors import HvdplusError
from ..common.reduce_ops import Average, ReduceOp, Sum
from ..common.scaling import Reduction, gradient_reduction
from ..common.sparse import gathered
from ..common.staleness import staleness_setting
from ..core import runtime
from ..core.communication_stats import count_payload, count_tensor, end_step
from ..core.compressed_reduction import (LossyCompression, compression_label, finish_all, require_same_compression,
                                         started)
from ..core.join import JoinHook
from ..core.load_balance import check_weighted_op
from ..core.process_sets import global_process_set, is_job, overlaps_in, size_in
from .compression import Compression
from .functions import broadcast_optimizer_state, broadcast_parameters
from .lossy_reduction import tensor_stages
from .mpi_ops import allgather_async, allreduce_async_, grouped_allreduce_async_

__all__ = ["DistributedOptimizer", "wrapped_in"]

# Fusion group size where the engine thread has a core of its own: small enough that the
# first groups are all-reduced while backward still runs, large enough to keep the
# per-request cost low. Not tuned, for want of a benchmark machine with a core to spare.
_OVERLAP_GROUP_BYTES = 4 * 1024 * 1024


class _DistributedOptimizer:
    """Mixed in before the user's optimizer class, so the wrapped optimizer stays an
    instance of that class (schedulers, state_dict and isinstance keep working)."""

    def _hvdplus_setup(self, named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set, load_balancer=None,
                       staleness=0):
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
        self._staleness = _checked_staleness(staleness, load_balancer)
        self._steps_submitted = 0  # with staleness: steps whose gradients went out; its parity names them
        if load_balancer is not None:
            check_weighted_op(op, "DistributedOptimizer(load_balancer=...)")
        _check_lossy(compression, op, load_balancer, self._staleness)
        self._load_balancer = load_balancer
        self._local_samples = None  # set_local_samples(n): this rank's samples per step, once given
        self._step_weight = None  # the weight of the step whose gradients are being submitted
        self._compression = compression
        self._lossy = isinstance(compression, LossyCompression)
        # Compression state made before the wrapped optimizer's first step, which may take an
        # empty state for "not started" (Adam): moved into self.state after that step.
        self._early_state = {}
        self._passes_per_step = backward_passes_per_step
        self._sparse_as_dense = sparse_as_dense
        self._sparse_dims = {}  # id(parameter) -> sparse_dim of its gradients, where they came sparse
        self._op, self._predivide, self._explicit_groups = op, gradient_predivide_factor, groups
        params = [p for group in self.param_groups for p in group["params"]]
        self._params = params
        self._names = _parameter_names(params, named_parameters)
        self._process_set = process_set
        self._set_gone = None  # why this optimizer can no longer step, once its set is gone
        self._hooks = []
        self._hvdplus_attach()
        # A job that re-forms (hvdplus.elastic) has a new size and engine: attach again.
        this = weakref.ref(self)
        self._hvdplus_detach_from_reforms = runtime.on_reform(lambda: this() is not None and this()._hvdplus_reformed())

    def _hvdplus_reformed(self):
        if is_job(self._process_set):
            self._hvdplus_attach()
            return
        # Not raised here, where it would stop the job's re-forming: step() raises it.
        self._set_gone = (f"DistributedOptimizer(process_set={self._process_set.ranks}): the job re-formed "
                          "(hvdplus.elastic), and process sets do not outlive that; add the set again and "
                          "wrap the optimizer anew")
        self._hvdplus_attach()

    def _hvdplus_attach(self):
        """Everything that depends on the size of the set the gradients are averaged over:
        the reduction, the fusion groups, the hooks, and a clean slate for the hooks'
        bookkeeping."""
        for hook in self._hooks:
            hook.remove()
        averaging = not self._set_gone and _averages_here(self._process_set)
        size = size_in(self._process_set, "DistributedOptimizer") if averaging else 1
        self._size = size
        params = self._params
        # A weighted average divides by the weights' total, so gradient_predivide_factor (which
        # only guards half-precision sums, and weighted sums run in float32 or wider) does not apply.
        self._weighted_reduction = Reduction(Average)
        self._reduction = gradient_reduction(self._op, self._predivide, size)
        trained = [p for p in params if p.requires_grad]
        if self._explicit_groups is None and size > 1:
            groups_of = _automatic_groups(trained, overlaps_in(self._process_set, "DistributedOptimizer"))
        else:
            groups_of = _fusion_groups(params, self._explicit_groups)
        # The hooks' bookkeeping is keyed by id(parameter): a tensor's own __hash__ is a
        # Python call, and the hooks ask it several times per gradient every step.
        self._groups = {id(p): group for p, group in groups_of.items()}
        self._passes_left = {id(p): self._passes_per_step for p in params}
        self._group_ready = {}
        self._submitted = set()
        self._pending = []
        # With staleness: the tensors that the gradients of the step being submitted are reduced
        # in (id(parameter) -> tensor), the previous step's (finishes, those tensors) still in
        # flight (None: nothing to apply next), and whether the coming step() applies any. A
        # re-formed job's engine is new: all-reduces the old one had in flight are dropped, but
        # gradients already there (hvdplus.elastic restores a commit before re-forming) are kept.
        self._delayed = {}
        in_flight = getattr(self, "_in_flight", None)
        self._in_flight = in_flight if in_flight is not None and not in_flight[0] else None
        self._applies = False
        self._synchronized = False
        self._should_synchronize = True
        self._compression_agreed = False
        self._hooks = []
        if size > 1:
            self._hooks = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in trained]

    # -- weights: the local sample count of each step --------------------------------
    def set_local_samples(self, samples):
        """Average the gradients of the coming steps weighted by `samples`, this rank's number
        of samples in them: sum_i(n_i g_i) / sum_i(n_i), the gradient of the mean loss over
        every rank's samples when each rank's loss is the mean over its own. Call it before
        `loss.backward()` (the gradients are submitted during backward); it holds until called
        again, and takes precedence over `load_balancer=`. None goes back to `load_balancer=`'s
        count where one was given, else to the plain average.

        Args:
            samples: a number of 0 or more (ranks may give 0, not all of them); checked on
                every rank when the gradients are reduced, so a bad one raises on all.
        """
        if samples is not None:
            check_weighted_op(self._op, "DistributedOptimizer.set_local_samples()")
            if self._staleness:
                raise ValueError(f"DistributedOptimizer(staleness={self._staleness}).set_local_samples({samples}): "
                                 "weighted averages of delayed gradients are not supported; use staleness=0")
            if self._lossy:
                raise ValueError(f"DistributedOptimizer.set_local_samples(): {self._compression!r} does not weight "
                                 "gradients; use Compression.none, .fp16 or .bf16")
        if self._submitted and samples != self._step_weight:
            raise RuntimeError(
                f"DistributedOptimizer.set_local_samples({samples}): this step's gradients are already being "
                f"averaged with weight {self._step_weight} (None: unweighted); set the count before loss.backward()")
        self._local_samples = samples

    def _weight(self):
        """This step's weight (None: the plain average), fixed at its first submission."""
        if self._step_weight is None:
            if self._local_samples is not None:
                self._step_weight = self._local_samples
            elif self._load_balancer is not None:
                self._step_weight = self._load_balancer.local_batch_size()
        return self._step_weight

    def _weighted(self) -> bool:
        return self._local_samples is not None or self._load_balancer is not None

    # -- hooks: submit each gradient once it is complete ------------------------------
    def _gradient_ready(self, param):
        key = id(param)
        if key in self._submitted:
            raise AssertionError(
                f"gradient of '{self._names[param]}' was computed more than backward_passes_per_step="
                f"{self._passes_per_step} times before step() or synchronize(); raise "
                "backward_passes_per_step to accumulate more passes"
            )
        left = self._passes_left[key] - 1
        self._passes_left[key] = left
        if left == 0:
            self._submit(param)

    def _submit(self, param):
        key = id(param)
        self._submitted.add(key)
        if self._lossy:
            self._pending.append(self._lossy_reduction(param))
            return
        group = self._groups.get(key)
        if group is None:
            self._pending.append(self._allreduce_gradient(param))
            return
        # A parameter is submitted once per step (see _gradient_ready), so counting suffices.
        ready = self._group_ready.get(id(group), 0) + 1
        if ready == len(group):
            self._group_ready.pop(id(group), None)  # never counted for a group of one
            self._pending.append(self._allreduce_group(group))
        else:
            self._group_ready[id(group)] = ready

    def _sparse_kept(self, param):
        # Gathered rows cannot be weighted by a total no rank knows yet: weighted, they go dense.
        return (param.grad is not None and not self._weighted()
                and gathered(param.grad.is_sparse, self._sparse_as_dense))

    def _gradient_to_reduce(self, param):
        """The dense tensor that `param`'s gradient of this step is reduced in: the gradient
        itself, or with staleness a copy of it, since the next step's backward overwrites the
        gradient while this step's all-reduce still runs."""
        if self._staleness and param.grad is not None and param.grad.is_sparse:
            # Raised the same on every rank: the ranks run the same model.
            raise ValueError(f"DistributedOptimizer(staleness={self._staleness}): the gradient of "
                             f"'{self._names[param]}' is sparse (e.g. nn.Embedding(sparse=True)); delayed "
                             "gradients are dense only: make the layer dense, or use staleness=0")
        grad = self._dense_gradient(param)
        if self._staleness:
            grad = grad.detach().clone()
            self._delayed[id(param)] = grad
        return grad

    def _gradient_name(self, prefix, param):
        """The collective's name: with staleness, two steps' all-reduces of one gradient are in
        flight at once, and the engine takes a name once at a time, so the step's parity is in it."""
        if self._staleness:
            prefix = f"{prefix}.{self._steps_submitted % 2}"
        return f"{prefix}.{self._names[param]}"

    def _dense_gradient(self, param):
        """The gradient to all-reduce of a parameter whose gradient is not gathered
        (_sparse_kept), so a sparse one here is made dense (sparse_as_dense); the parameter
        gets it back sparse once reduced (_sparse_again)."""
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        elif param.grad.is_sparse:
            self._sparse_dims[id(param)] = param.grad.sparse_dim()
            param.grad = param.grad.to_dense()
        return param.grad

    def _sparse_again(self, param):
        """Make the reduced gradient of a parameter whose gradients come sparse (an
        nn.Embedding(sparse=True)) sparse again, as Horovod does with sparse_as_dense, since
        optimizers such as SparseAdam take only sparse gradients. Its rows of zeros are
        left out. A step where the parameter had no gradient also ends sparse."""
        sparse_dim = self._sparse_dims.get(id(param))
        if sparse_dim is not None:
            param.grad = param.grad.to_sparse(sparse_dim).coalesce()

    def _on_the_wire(self, grad):
        """(tensor to reduce in place, compression context); a tensor other than `grad` is
        copied back into it when reduced. A parameter in channels_last gets its gradient in
        that layout (torch's gradient layout contract), which is not C-contiguous: it is
        reduced as a contiguous copy."""
        wire, ctx = self._compression.compress(grad)
        if not wire.is_contiguous():
            wire = wire.contiguous()
        label = compression_label(self._compression)
        count_tensor(label, grad.numel() * grad.element_size())
        count_payload(label, "allreduce", wire.numel() * wire.element_size())
        return wire, ctx

    def _lossy_reduction(self, param):
        """Start a gradient's reduction with a compressor that keeps state (int8, top-k,
        PowerSGD), each on its own: its first stage now, the rest at synchronize()."""
        grad = self._dense_gradient(param)
        stages = tensor_stages(self._compression, grad, f"grad.{self._names[param]}", self._compression_state(param),
                               self._reduction.factor(self._size), self._process_set)

        def then_sparse_again():
            yield from stages
            self._sparse_again(param)

        return started(then_sparse_again())

    def _compression_state(self, param):
        """The dict that holds `param`'s compression state: its optimizer state once the
        wrapped optimizer has made some, until then one of ours (see _early_state)."""
        if self.state.get(param):
            return self.state[param]
        return self._early_state.setdefault(param, {})

    def _adopt_early_state(self):
        for param, store in self._early_state.items():
            self.state[param].update(store)
        self._early_state = {}

    def _allreduce_gradient(self, param):
        """Submit one gradient's all-reduce; returns the function that finishes it."""
        if self._sparse_kept(param) and not self._staleness:
            return self._allgather_sparse_gradient(param)
        grad = self._gradient_to_reduce(param)
        wire, ctx = self._on_the_wire(grad)
        weight = self._weight()
        op, prescale, postscale = self._reduction if weight is None else self._weighted_reduction
        handle = allreduce_async_(wire, name=self._gradient_name("grad", param), op=op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self._process_set, weight=weight)

        def finish():
            handle.wait()
            if wire is not grad:
                grad.copy_(self._compression.decompress(wire, ctx))
            self._sparse_again(param)

        return finish

    def _allreduce_group(self, group):
        """Submit a group's all-reduce (its sparse gradients are gathered on their own)."""
        gathered, grads, dense = [], [], []
        for p in group:
            if self._sparse_kept(p) and not self._staleness:
                gathered.append(self._allgather_sparse_gradient(p))
            else:
                grads.append(self._gradient_to_reduce(p))
                dense.append(p)
        compressed = [self._on_the_wire(g) for g in grads]
        weight = self._weight()
        op, prescale, postscale = self._reduction if weight is None else self._weighted_reduction
        name = self._gradient_name("grads", group[0])
        handle = grouped_allreduce_async_([w for w, _ in compressed], name=name, op=op, prescale_factor=prescale,
                                          postscale_factor=postscale, process_set=self._process_set, weight=weight)

        def finish():
            try:
                handle.wait()
            except (HvdplusError, TypeError, ValueError) as error:
                # The core names the group's members by index; the user knows parameter names.
                members = ", ".join(f"{index} '{self._names[p]}'" for index, p in enumerate(dense))
                raise type(error)(f"{error}\n  members of '{name}': {members}") from None
            for param, grad, (wire, ctx) in zip(dense, grads, compressed):
                if wire is not grad:
                    grad.copy_(self._compression.decompress(wire, ctx))
                self._sparse_again(param)
            for finish_sparse in gathered:
                finish_sparse()

        return finish

    def _allgather_sparse_gradient(self, param):
        """Sparse gradients (e.g. nn.Embedding(sparse=True)) are gathered, not densified, as
        Horovod's sparse_allreduce does: every rank's rows are concatenated, scaled as the
        reduction scales them (Average divides by the size) and summed where they repeat. The
        gradient stays sparse, so torch.optim.SparseAdam takes it."""
        grad = param.grad.coalesce()
        name = self._names[param]
        indices = allgather_async(grad.indices().t().contiguous(), name=f"sparse_indices.{name}",
                                  process_set=self._process_set)
        values = allgather_async(grad.values().contiguous(), name=f"sparse_values.{name}",
                                 process_set=self._process_set)
        scale = self._reduction.factor(self._size)

        def finish():
            gathered = torch.sparse_coo_tensor(indices.wait().t(), values.wait() * scale, grad.shape,
                                               check_invariants=True)
            param.grad = gathered.coalesce()

        return finish

    # -- the user-facing protocol -----------------------------------------------------
    def join_hook(self) -> JoinHook:
        """This optimizer as a Joinable (hvdplus.core.join): once every rank has joined, each
        takes the last joiner's parameters and optimizer state, which took the most steps."""
        return _TakeTheLastJoinersState(self)

    def synchronize(self):
        """Wait for every gradient's all-reduce (submitting those whose hooks did not fire,
        e.g. parameters unused this step, so that every rank submits the same names).

        With staleness, this step's all-reduces are left running, and the previous step's are
        waited for instead: afterwards each parameter's `.grad` holds the averaged gradient of
        the previous step, the one `step()` applies (None everywhere in the first step, which
        applies nothing)."""
        if self._set_gone:
            raise ValueError(self._set_gone)
        if self._hooks and not self._compression_agreed:
            # Once per attachment: ranks that compress differently would submit collectives
            # that never pair up, so each learns of it here instead, before waiting on them.
            require_same_compression(self._compression, "DistributedOptimizer", self._process_set)
            self._compression_agreed = True
        if self._hooks:
            for param in self._params:
                if param.requires_grad and id(param) not in self._submitted:
                    self._submit(param)
        pending, self._pending = self._pending, []
        delayed, self._delayed = self._delayed, {}
        try:
            if self._staleness:
                pending, delayed = self._keep_in_flight(pending, delayed)
            finish_all(pending)
            end_step()
        finally:
            # Also after a failed all-reduce, so the next step starts afresh (hvdplus.elastic).
            self._submitted.clear()
            self._group_ready.clear()
            self._step_weight = None
            for key in self._passes_left:
                self._passes_left[key] = self._passes_per_step
        if self._staleness:
            self._put_in_grad(delayed)
        self._synchronized = True

    def _keep_in_flight(self, pending, delayed):
        """Keep this step's all-reduces (`pending`, into `delayed`) in flight for the next step;
        returns the previous step's, to wait for and apply now (([], None) where there are none).
        A rank that averages nothing (alone, or outside the process set) delays its own gradients."""
        if not self._hooks:
            delayed = {id(p): None if p.grad is None else p.grad.detach().clone() for p in self._params}
        previous = self._in_flight or ([], None)
        self._in_flight = (pending, delayed)
        self._steps_submitted += 1
        return previous

    def _put_in_grad(self, delayed):
        """Make the gradients that step() applies the parameters' `.grad`: `delayed`, by
        id(parameter), or none at all (the first step)."""
        self._applies = delayed is not None
        for param in self._params:
            if delayed is None:
                param.grad = None
            elif id(param) in delayed:
                param.grad = delayed[id(param)]

    def _wait_in_flight(self):
        """Wait for the all-reduces still in flight from the last step (an error drops them)."""
        if self._in_flight is None:
            return
        pending, delayed = self._in_flight
        self._in_flight = None
        for finish in pending:
            finish()
        self._in_flight = ([], delayed)

    def state_dict(self):
        """The wrapped optimizer's state_dict(); with staleness also, under "staleness", the
        number of steps taken and the averaged gradients that the next step applies (by
        parameter index; waiting for their all-reduces), so a run resumed from it applies them
        as this one would have."""
        state = super().state_dict()
        if self._staleness:
            self._wait_in_flight()
            delayed = None if self._in_flight is None else self._in_flight[1]
            state["staleness"] = {
                "steps": self._steps_submitted,
                "gradients": None if delayed is None else [
                    None if delayed.get(id(p)) is None else delayed[id(p)].detach().clone() for p in self._params],
            }
        return state

    def load_state_dict(self, state_dict):
        """Load the wrapped optimizer's state; with staleness also the gradients that the next
        step applies, where `state_dict` has them (one saved with staleness=0, or in the first
        step, has none: the next step then applies nothing)."""
        state_dict = dict(state_dict)
        delayed = state_dict.pop("staleness", None)
        # The loaded state holds the compression state it was saved with (or none): what this
        # optimizer kept aside before its first step is older.
        self._early_state = {}
        super().load_state_dict(state_dict)
        if not self._staleness:
            return
        # What this optimizer still has in flight is replaced, but finished first, since its
        # names come round again. It fails where a rank died (hvdplus.elastic restores the
        # commit before the job re-forms): replaced anyway, it is dropped then.
        with contextlib.suppress(HvdplusError):
            self._wait_in_flight()
        self._in_flight = None
        if delayed is None:
            return
        self._steps_submitted = int(delayed["steps"])
        gradients = delayed["gradients"]
        if gradients is None:
            return
        if len(gradients) != len(self._params):
            raise ValueError(f"DistributedOptimizer.load_state_dict: the state has delayed gradients of "
                             f"{len(gradients)} parameters, this optimizer trains {len(self._params)}")
        kept = {}
        for param, grad in zip(self._params, gradients):
            if grad is None:
                continue
            if tuple(grad.shape) != tuple(param.shape):
                raise ValueError(f"DistributedOptimizer.load_state_dict: the delayed gradient of "
                                 f"'{self._names[param]}' has shape {tuple(grad.shape)}, the parameter "
                                 f"{tuple(param.shape)}")
            kept[id(param)] = grad.detach().to(param).clone()
        self._in_flight = ([], kept)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For `step()` after an explicit `synchronize()` (gradient clipping, AMP's GradScaler):

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._staleness and closure is not None:
            raise ValueError(f"DistributedOptimizer(staleness={self._staleness}).step(closure): a closure's "
                             "gradients would be applied a step late; call backward before step()")
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's words, which users search for.
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your "
                    "code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if self._staleness and not self._applies:
            return None  # the first step: its gradients are only sent
        result = super().step(closure)
        self._adopt_early_state()
        return result

    def _hvdplus_local_step(self):
        """The wrapped optimizer's step on this rank's gradients as they are, reducing nothing
        (broadcast_optimizer_state primes a fresh optimizer so, on the ranks that need it)."""
        return super().step()

    def zero_grad(self, set_to_none: bool = True):
        if self._submitted:
            raise AssertionError(
                "optimizer.zero_grad() was called while gradients were still being all-reduced "
                "(after loss.backward(), before optimizer.step() or optimizer.synchronize()); "
                "zero the gradients before backward, or call step() first"
            )
        return super().zero_grad(set_to_none)


def _checked_staleness(staleness, load_balancer) -> int:
    """The staleness as an int, 0 or 1; ValueError for another, or for one with load_balancer=."""
    staleness = staleness_setting(staleness)
    if staleness and load_balancer is not None:
        raise ValueError("DistributedOptimizer(staleness=1, load_balancer=...): weighted averages of delayed "
                         "gradients are not supported; use staleness=0")
    return staleness


def _check_lossy(compression, op, load_balancer, staleness):
    """A compressor with state (int8, top-k, PowerSGD) sums: it takes Average or Sum, unweighted,
    and its reductions finish within their step."""
    if not isinstance(compression, LossyCompression):
        return
    if op not in (Average, Sum):
        raise ValueError(f"DistributedOptimizer(compression={compression!r}) takes op Average or Sum, got "
                         f"{ReduceOp(op).label}")
    if load_balancer is not None:
        raise ValueError(f"DistributedOptimizer(compression={compression!r}) does not weight gradients, so it "
                         "cannot take load_balancer=; use Compression.none, .fp16 or .bf16")
    if staleness:
        raise ValueError(f"DistributedOptimizer(compression={compression!r}, staleness={staleness}): delayed "
                         "gradients are not compressed with error feedback; use Compression.none, .fp16 or .bf16")


def _averages_here(process_set) -> bool:
    """Whether this rank is in the set whose ranks average the gradients."""
    return is_job(process_set) or process_set.process_set_id is None or process_set.included()


class _TakeTheLastJoinersState(JoinHook):
    def __init__(self, optimizer):
        self._optimizer = optimizer

    def post_hook(self, last_rank: int) -> None:
        optimizer = self._optimizer
        broadcast_parameters([(f"join.{optimizer._names[p]}", p) for p in optimizer._params], last_rank,
                             process_set=optimizer._process_set)
        broadcast_optimizer_state(optimizer, last_rank, process_set=optimizer._process_set)


def _parameter_names(params, named_parameters):
    if named_parameters is None:
        return {p: f"param.{index}" for index, p in enumerate(params)}
    named = list(named_parameters)
    if named and not all(isinstance(item, tuple) and len(item) == 2 for item in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, e.g. model.named_parameters()")
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(duplicates)}")
    by_param = {p: name for name, p in named}
    unnamed = [index for index, p in enumerate(params) if p not in by_param]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters are not in it "
            f"(positions {unnamed[:10]}); pass model.named_parameters() of the model the optimizer trains"
        )
    return by_param


def _automatic_groups(params, overlap: bool):
    """Fusion groups for `params` when the user gave none: in reverse order (as backward
    tends to finish them), one dtype and device each, and with `overlap` of at most
    _OVERLAP_GROUP_BYTES each (and at least one parameter)."""
    groups, current, current_bytes = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and (p.dtype != current[0].dtype or p.device != current[0].device
                        or (overlap and current_bytes + nbytes > _OVERLAP_GROUP_BYTES)):
            groups.append(current)
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += nbytes
    if current:
        groups.append(current)
    return {p: group for group in groups for p in group}


def _fusion_groups(params, groups):
    """Map each parameter to the list of parameters it is all-reduced together with."""
    if groups is None or groups == 0:
        return {}
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a positive number or a list of parameter lists, got {groups}")
        members = [list(chunk) for chunk in np.array_split(np.arange(len(params)), groups) if len(chunk)]
        groups = [[params[i] for i in chunk] for chunk in members]
    by_param = {}
    known = set(params)
    for group in groups:
        group = list(group)
        for p in group:
            if p not in known:
                raise ValueError("groups lists a parameter that the optimizer does not train")
            if p in by_param:
                raise ValueError("a parameter appears in more than one of groups")
            by_param[p] = group
    return by_param


def wrapped_in(optimizer, mixin):
    """A copy of `optimizer` whose class is `mixin` before the optimizer's own, sharing its
    parameters, state and hooks, so it stays an instance of that class (schedulers,
    state_dict and isinstance keep working)."""
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    return wrapped


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=global_process_set,
                         load_balancer=None, staleness=0):
    """Wrap `optimizer` so that `step()` applies gradients averaged over all ranks.

    Args:
        optimizer: any torch.optim optimizer; its state and hooks carry over.
        named_parameters: `model.named_parameters()`, to name the all-reduces (recommended).
        compression: Compression.none, .fp16, .bf16 (cast for the wire), or .int8,
            .topk(ratio), .powersgd(rank=r, warmup_steps=w) (lossy, with error feedback kept
            in the optimizer's state; op Average or Sum, unweighted); see docs/compression.md.
        backward_passes_per_step: backward passes accumulated locally before each all-reduce.
        op: Average (default) or Sum over ranks.
        gradient_predivide_factor: with Average, divide by f before the sum and by size/f after.
        num_groups: Horovod's older spelling of `groups=<number>` (0: not given).
        groups: None, a number of fusion groups, or lists of parameters reduced together.
        sparse_as_dense: densify sparse gradients instead of allgathering them.
        process_set: the ranks whose gradients are averaged (default: every rank); a rank
            outside the set applies its own gradients, as in Horovod.
        load_balancer: an hvdplus LoadBalancer (op Average only): each step's gradients are
            averaged weighted by its `local_batch_size()`, read when backward submits the
            first of them, so that uneven local batches give the gradient of the mean loss
            over all of them. `set_local_samples(n)` gives the count by hand instead.
        staleness: 0 (default): each step applies its own averaged gradients. 1: step t
            applies the gradients averaged in step t-1, whose all-reduces run behind step t's
            forward and backward; step 0 only sends its gradients and changes no parameter.
            Not with load_balancer=, set_local_samples(), sparse gradients or step(closure).
    """
    if num_groups and groups is None:
        groups = num_groups
    wrapped = wrapped_in(optimizer, _DistributedOptimizer)
    wrapped._hvdplus_setup(named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense, process_set, load_balancer,
                           staleness)
    return wrapped
