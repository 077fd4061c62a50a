"""ZeroRedundancyOptimizer: each rank keeps the optimizer state of its share of the
parameters only (ZeRO stage 1), and with `shard_gradients=True` its share of the gradients
too (stage 2).

The parameters are dealt over the ranks of the process set by size, largest first
(hvdplus.common.size_partition), alike on every rank with no message. Each rank builds the
user's optimizer class over its share alone, so that optimizer's state exists for that
share only. The gradients travel as DistributedOptimizer's do, which this class extends: a
hook per parameter submits each fusion group once backward has produced it, so
communication overlaps the rest of backward. Stage 1 all-reduces them; stage 2 reduces the
members of each group to the rank that owns them, one fused request per owner, and the
other ranks drop those gradients (`.grad = None`) as soon as they are sent. `step()` then
updates the rank's share, and the updated parameters are all-gathered from their owners, one
request per dtype and device, all submitted before the first is waited for.

Checkpoints (hvdplus.torch.zero_checkpoint): `state_dict()` is this rank's shard,
`consolidate_state_dict(to)` the full, torch-style dict, and `load_state_dict()` takes
either, at any number of ranks. hvd.elastic.TorchState commits the full dict on every rank,
so that any survivors of a lost rank hold it and reshard it over the new size.
"""

import torch

from ..common.reduce_ops import Average
from ..common.size_partition import owned_by, partition_by_size
from ..core import collectives, runtime
from ..core.process_sets import global_process_set, rank_in, ranks_in, require_member
from .compression import Compression
from .mpi_ops import allgather_async, reduce_async
from .optimizer import _DistributedOptimizer
from .zero_checkpoint import SHARD_KEY, check_layout, inner_part, is_shard, make_shard, merged

__all__ = ["ZeroRedundancyOptimizer"]

_WHAT = "ZeroRedundancyOptimizer"


class _ShardedStep:
    """What _DistributedOptimizer's step() calls once the gradients are reduced: the step of
    this rank's share, then the all-gather of the updated parameters."""

    def step(self, closure=None):
        if closure is not None:
            raise ValueError(f"{_WHAT}.step() takes no closure: call loss.backward() before step()")
        self._hyper_parameters_inward()
        if self._owned:
            self.optim.step()
        self._gather_parameters()


class ZeroRedundancyOptimizer(_DistributedOptimizer, _ShardedStep, torch.optim.Optimizer):
    """An optimizer whose state (and with `shard_gradients`, gradients) is sharded over the
    ranks; use it where hvd.DistributedOptimizer(optimizer_class(params, **defaults)) would go.

    Args:
        params: the parameters, or parameter groups (dicts with "params" and their own
            hyper-parameters), as any torch.optim optimizer takes them.
        optimizer_class: the torch.optim optimizer class each rank builds over its share
            (SGD, Adam, AdamW, ...); one whose step needs a closure (L-BFGS) is not supported.
        process_set: the ranks that share the state and average the gradients (default:
            every rank); this rank must be one of them.
        shard_gradients: also shard the gradients (ZeRO stage 2): each is reduced to its
            owner alone, and freed on the other ranks.
        named_parameters: `model.named_parameters()`, to name the requests and the errors.
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        backward_passes_per_step: backward passes accumulated locally before each reduction.
        **defaults: the optimizer's hyper-parameters (lr, momentum, betas, ...).
    """

    def __init__(self, params, optimizer_class, process_set=None, shard_gradients=False, *,
                 named_parameters=None, compression=Compression.none, backward_passes_per_step=1, **defaults):
        process_set = global_process_set if process_set is None else process_set
        require_member(process_set, _WHAT)
        self.optim = None  # the optimizer of this rank's share, made by _partition
        self._owned = []
        torch.optim.Optimizer.__init__(self, params, defaults)
        self._optimizer_class = optimizer_class
        self._given_defaults = dict(defaults)
        self._shard_gradients = bool(shard_gradients)
        self._hvdplus_setup(named_parameters, compression, backward_passes_per_step, Average, 1.0, None, False,
                            process_set)
        try:
            self._check_alike_on_every_rank()
        except ValueError:
            for hook in self._hooks:  # the parameters stay usable by an optimizer made right
                hook.remove()
            self._hvdplus_detach_from_reforms()
            raise

    # -- the state of this rank's share -------------------------------------------------
    @property
    def state(self):
        """The optimizer state of this rank's parameters (the others have none here)."""
        return self.optim.state if self.optim is not None else self._unsharded_state

    @state.setter
    def state(self, value):
        # torch.optim.Optimizer.__init__ sets an (empty) state; the inner optimizer's is the one.
        self._unsharded_state = value

    def _hvdplus_attach(self):
        """DistributedOptimizer's hooks and groups, then the partition, for the set's size
        now (again after an elastic re-form)."""
        super()._hvdplus_attach()
        if not self._set_gone:
            self._partition()

    def _partition(self):
        self._set_ranks = ranks_in(self._process_set, _WHAT)
        self._set_rank = rank_in(self._process_set, _WHAT)
        self._index = {id(p): index for index, p in enumerate(self._params)}
        self._owner_of = partition_by_size([p.numel() * p.element_size() for p in self._params],
                                           len(self._set_ranks))
        self._owned = owned_by(self._owner_of, self._set_rank)
        self._buckets = {}  # (dtype, device) -> the global indices of its parameters, in order
        for index, p in enumerate(self._params):
            self._buckets.setdefault((p.dtype, p.device), []).append(index)
        kept = dict(self.optim.state) if self.optim is not None else {}
        groups = []
        for group in self.param_groups:
            shared = {key: value for key, value in group.items() if key != "params"}
            groups.append({**shared, "params": [p for p in group["params"] if self._owns(p)]})
        self.optim = self._optimizer_class(groups, **self._given_defaults)
        for p, state in kept.items():
            if self._owns(p):  # still this rank's after a re-form: its state stays
                self.optim.state[p] = state
        # The outer groups show what the optimizer class fills in (betas, eps, ...), so that
        # schedulers and state dicts see every hyper-parameter.
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for key, value in inner.items():
                if key != "params":
                    outer.setdefault(key, value)

    def _owns(self, param) -> bool:
        return self._owner_of[self._index[id(param)]] == self._set_rank

    def _hyper_parameters_inward(self):
        """The outer groups' hyper-parameters (which schedulers change) into the inner ones."""
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value

    # -- agreement: the same use on every rank ------------------------------------------
    def _check_alike_on_every_rank(self):
        """ValueError on every rank unless each made this optimizer alike (one all-gather):
        the same stage, class, settings and parameters, named where they differ."""
        cls = self._optimizer_class
        mine = {
            "shard_gradients": self._shard_gradients,
            "optimizer_class": f"{cls.__module__}.{cls.__qualname__}",
            "backward_passes_per_step": self._passes_per_step,
            "compression": getattr(self._compression, "__name__", repr(self._compression)),
            "parameters per group": [len(group["params"]) for group in self.param_groups],
            "defaults": repr(sorted(self._given_defaults.items())),
        }
        parameters = [(self._names[p], tuple(p.shape), str(p.dtype)) for p in self._params]
        everyone = collectives.allgather_object((mine, parameters), name="zero.agreement",
                                                process_set=self._process_set)
        problems = [_differing(key, [row[0][key] for row in everyone], self._set_ranks) for key in mine]
        problems.append(_differing_parameter([row[1] for row in everyone], self._set_ranks))
        problems = [problem for problem in problems if problem]
        if problems:
            raise ValueError(f"{_WHAT}: the ranks made it differently: {'; '.join(problems)}")

    # -- stage 2: each gradient to its owner ----------------------------------------------
    def set_local_samples(self, samples):
        if self._shard_gradients and samples is not None:
            raise NotImplementedError(f"{_WHAT}(shard_gradients=True) averages unweighted; set_local_samples "
                                      "needs shard_gradients=False")
        super().set_local_samples(samples)

    def _allreduce_gradient(self, param):
        if not self._shard_gradients:
            return super()._allreduce_gradient(param)
        return self._reduce_to_owners([param])

    def _allreduce_group(self, group):
        if not self._shard_gradients:
            return super()._allreduce_group(group)
        return self._reduce_to_owners(group)

    def _reduce_to_owners(self, params):
        """Submit the reduction of `params`' gradients to their owners, one request per
        owner; returns the function that finishes them."""
        by_owner = {}
        for p in params:
            by_owner.setdefault(self._owner_of[self._index[id(p)]], []).append(p)
        finishes = [self._reduce_to(owner, members) for owner, members in sorted(by_owner.items())]

        def finish():
            for finish_one in finishes:
                finish_one()

        return finish

    def _reduce_to(self, owner, members):
        grads = [self._dense_gradient(p) for p in members]
        wires = [self._on_the_wire(grad) for grad in grads]
        flat = torch.cat([wire.reshape(-1) for wire, _ in wires]) if len(wires) > 1 else wires[0][0].reshape(-1)
        op, prescale, postscale = self._reduction
        handle = reduce_async(flat, self._set_ranks[owner], name=f"zero.grads.{self._names[members[0]]}", op=op,
                              prescale_factor=prescale, postscale_factor=postscale, process_set=self._process_set)
        if owner != self._set_rank:
            for p in members:
                p.grad = None  # the request holds what it sends until it is done
            return handle.wait

        def finish():
            reduced, offset = handle.wait(), 0
            for p, grad, (wire, ctx) in zip(members, grads, wires):
                block = reduced[offset:offset + wire.numel()].view(wire.shape)
                offset += wire.numel()
                grad.copy_(self._compression.decompress(block, ctx))
                self._sparse_again(p)

        return finish

    # -- the updated parameters, from their owners ----------------------------------------
    def _gather_parameters(self):
        if len(self._set_ranks) == 1:
            return
        pending = []
        for (dtype, device), members in self._buckets.items():
            mine = [self._params[index].detach().reshape(-1) for index in members if self._owner_of[index]
                    == self._set_rank]
            flat = torch.cat(mine) if mine else torch.empty(0, dtype=dtype, device=device)
            name = f"zero.parameters.{str(dtype).replace('torch.', '')}.{device}"
            pending.append((members, allgather_async(flat, name=name, process_set=self._process_set)))
        with torch.no_grad():
            for members, handle in pending:
                gathered, offset = handle.wait(), 0
                for owner in range(len(self._set_ranks)):
                    for index in members:
                        if self._owner_of[index] != owner:
                            continue
                        param = self._params[index]
                        if owner != self._set_rank:
                            param.copy_(gathered[offset:offset + param.numel()].view(param.shape))
                        offset += param.numel()

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's shard: the state of its parameters, keyed by their global indices (as
        a torch optimizer numbers all its parameters), every group's hyper-parameters, and a
        "zero_shard" entry: {"rank", "size", "owned", "num_parameters"}."""
        self._hyper_parameters_inward()
        inner = self.optim.state_dict()
        global_of_local = [self._index[id(p)] for group in self.optim.param_groups for p in group["params"]]
        group_params = [[self._index[id(p)] for p in group["params"]] for group in self.param_groups]
        return make_shard(inner, global_of_local, group_params, self._set_rank, len(self._set_ranks),
                          len(self._params))

    def consolidate_state_dict(self, to=0):
        """The full, torch-style state dict (every rank's shard merged) on job rank `to`, and
        None on the others; `to=None` gives it to every rank. Every rank of the set calls it.
        The shards travel by one all-gather, so for a moment each rank holds them all.

        Args:
            to: the job rank that gets the dict (in the set), or None for every rank.
        """
        if to is not None and to not in self._set_ranks:
            raise ValueError(f"{_WHAT}.consolidate_state_dict(to={to}): rank {to} is not in the set "
                             f"{self._set_ranks}")
        shards = collectives.allgather_object(self.state_dict(), name="zero.consolidate",
                                              process_set=self._process_set)
        if to is not None and runtime.rank() != to:
            return None
        return merged(shards)

    def load_state_dict(self, state_dict) -> None:
        """Load a full dict (consolidate_state_dict's, or a torch optimizer's over the same
        parameter groups), a shard, or a list of shards, whatever number of ranks saved it.

        A full dict, or a list of shards that covers every parameter, loads on each rank
        alone. A shard saved at this number of ranks must be this rank's. Shards saved at
        another number of ranks are resharded: every rank of the set calls this at once, each
        with one shard, and those together must cover every parameter.
        """
        full = self._full_dict(state_dict)
        check_layout(full, [len(group["params"]) for group in self.param_groups])
        for outer, group in zip(self.param_groups, full["param_groups"]):
            outer.update({key: value for key, value in group.items() if key != "params"})
        spots = [[spot for spot, p in enumerate(group["params"]) if self._owns(p)] for group in self.param_groups]
        self.optim.load_state_dict(inner_part(full, spots))

    def _full_dict(self, state_dict) -> dict:
        """A dict with (at least) this rank's parameters' state, from what load_state_dict took."""
        if isinstance(state_dict, (list, tuple)):
            return merged(list(state_dict))
        if not is_shard(state_dict):
            return state_dict
        meta = state_dict[SHARD_KEY]
        if meta["size"] == len(self._set_ranks):
            if meta["owned"] != self._owned:
                raise ValueError(
                    f"{_WHAT}.load_state_dict: this is the shard of rank {meta['rank']} of {meta['size']}, which "
                    f"owned parameters {meta['owned'][:10]}; this rank ({self._set_rank}) owns {self._owned[:10]}: "
                    "load this rank's own shard, or a consolidated dict")
            return state_dict
        shards = collectives.allgather_object(state_dict, name="zero.reshard", process_set=self._process_set)
        unique = {shard[SHARD_KEY]["rank"]: shard for shard in shards}
        return merged(list(unique.values()))

    def _hvdplus_broadcast_state(self, root_rank, process_set=None):
        """broadcast_optimizer_state for this optimizer: `root_rank`'s full state, resharded."""
        full = self.consolidate_state_dict(to=root_rank)
        full = collectives.broadcast_object(full, root_rank, name="zero.broadcast_state",
                                            process_set=self._process_set)
        self.load_state_dict(full)

    def _hvdplus_local_step(self):
        raise NotImplementedError(f"{_WHAT} steps only on every rank of its set at once")

    def __repr__(self):
        return (f"{_WHAT}({self._optimizer_class.__name__}, stage {2 if self._shard_gradients else 1}, "
                f"rank {self._set_rank} of {len(self._set_ranks)} owns {len(self._owned)} of "
                f"{len(self._params)} parameters)")


def _differing(key, values, ranks):
    """"key: rank 0 has a, ranks 1, 2 have b", or None where every rank has the same."""
    by_value = {}
    for rank, value in zip(ranks, values):
        by_value.setdefault(repr(value), []).append(rank)
    if len(by_value) == 1:
        return None
    listed = ", ".join(f"rank {who[0]} has {value}" if len(who) == 1 else f"ranks {', '.join(map(str, who))} have "
                       f"{value}" for value, who in by_value.items())
    return f"{key}: {listed}"


def _differing_parameter(lists, ranks):
    """The first parameter (name, shape, dtype) that differs between the ranks' lists."""
    longest = max(len(parameters) for parameters in lists)
    for index in range(longest):
        described = [repr(parameters[index]) if index < len(parameters) else "none" for parameters in lists]
        problem = _differing(f"parameter {index} (name, shape, dtype)", described, ranks)
        if problem:
            return problem
    return None
