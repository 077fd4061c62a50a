"""Elastic training with PyTorch: `hvd.elastic.TorchState`, `hvd.elastic.ElasticSampler`.

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for batch_idx, (data, target) in enumerate(loader):
                ...
                state.sampler.record_batch(batch_idx, batch_size)
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)

Models and optimizers roll back through their state dicts, and sync by broadcasting them
from the rank with the newest commit; an ElasticSampler re-shards what is left of its epoch over the new ranks.
With a LocalSGD or DiLoCo optimizer, commit where the ranks' parameters agree
(`if optimizer.averaged: state.commit()`); `commit()` refuses elsewhere.
"""

import copy
import random
from typing import Any, Callable, List

import numpy as np
import torch

from ..elastic import HostsUpdatedInterrupt, ObjectHandler, ObjectState, RanksFailedError, State, run
from ..core import runtime
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .zero import ZeroRedundancyOptimizer

__all__ = ["TorchState", "ElasticSampler", "run", "ObjectState", "State", "HostsUpdatedInterrupt",
           "RanksFailedError"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the ranks, and after a re-form goes on with the samples the
    epoch has not yet committed, over the new number of ranks: none repeated, none skipped.

    What is left of the epoch is dealt round-robin, so the ranks' shares differ by at most
    one sample. `record_batch` marks the batch as processed on every rank at once (the
    batches of all ranks are known to each), so the committed progress survives the death
    of any rank.

    Args:
        dataset: anything with a length.
        shuffle: visit the samples in an order drawn from `seed` and the epoch.
        seed: the same on every rank.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`, with no sample processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def reset(self) -> None:
        """Deal what is left of the epoch over the ranks the job has now."""
        self.num_replicas = runtime.size() if runtime.is_initialized() else 1
        self.rank = runtime.rank() if runtime.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.indices = self._share(self.rank)

    def _share(self, rank: int) -> List[int]:
        return self.remaining_indices[rank::self.num_replicas]

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's samples in batch `batch_idx` (counted since the last reset)."""
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch `batch_idx` of every rank as processed."""
        for rank in range(self.num_replicas):
            self.processed_indices.update(self._share(rank)[batch_idx * batch_size:(batch_idx + 1) * batch_size])

    def record_indices(self, indices) -> None:
        """Mark `indices` as processed (on this rank; the state's sync unites the ranks')."""
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class _StateDictHandler(ObjectHandler):
    """Keeps a copy of a value's `state_dict()` (a model, an optimizer, a sampler); `sync`
    is how one rank's value reaches the others."""

    def __init__(self, value, sync: Callable[[Any, str, int], None]):
        self._sync = sync
        self.save(value)

    def save(self, value):
        # Into the tensors of the last commit: allocating a model's worth of fresh memory
        # at every commit costs more than the copy itself.
        self.saved = _copied(value.state_dict(), getattr(self, "saved", None))

    def restore(self, value):
        # load_state_dict may keep the tensors it is given (optimizers do): hand it a copy.
        value.load_state_dict(_copied(self.saved))
        return value

    def sync(self, value, name, root_rank=0):
        self._sync(value, name, root_rank)
        return value

    def snapshot(self):
        # numpy views of the saved tensors, which pickle writes from their own memory; a
        # tensor's own pickling copies it whole first.
        return _mapped(self.saved, _as_array)

    def load(self, value, snapshot):
        self.saved = _mapped(snapshot, _TensorValues.tensor, kind=_TensorValues)
        return self.restore(value)


class _ShardedOptimizerHandler(_StateDictHandler):
    """Keeps a ZeroRedundancyOptimizer's full state dict on every rank (one all-gather of the
    shards per commit), so that the survivors of any lost rank hold all of it, and reshards
    it over the ranks there are when it is restored or synced."""

    def __init__(self, optimizer):
        super().__init__(optimizer, sync=None)

    def save(self, value):
        self.saved = _copied(value.consolidate_state_dict(to=None), getattr(self, "saved", None))

    def sync(self, value, name, root_rank=0):
        # Every rank that holds the newest commit holds the same full dict: the root's goes to
        # the others, and each takes its share of it for the size the job has now.
        full = broadcast_object(self.saved if runtime.rank() == root_rank else None, root_rank=root_rank, name=name)
        value.load_state_dict(_copied(full))  # the optimizer keeps the tensors it loads: never the saved ones
        return value


def _sync_model(model, name, root_rank):
    broadcast_parameters(model.state_dict(), root_rank=root_rank)


def _sync_optimizer(optimizer, name, root_rank):
    broadcast_optimizer_state(optimizer, root_rank=root_rank)


def _sync_sampler(sampler, name, root_rank):
    sampler.load_state_dict(broadcast_object(sampler.state_dict(), root_rank=root_rank, name=name))


def _handler_for(value: Any):
    if isinstance(value, torch.nn.Module):
        return _StateDictHandler(value, _sync_model)
    if isinstance(value, ZeroRedundancyOptimizer):
        return _ShardedOptimizerHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _StateDictHandler(value, _sync_optimizer)
    if isinstance(value, ElasticSampler):
        return _StateDictHandler(value, _sync_sampler)
    return ObjectHandler(value)


class _TensorValues:
    """A saved tensor's values as a numpy array, in a snapshot; `tensor()` makes it a tensor again."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


def _as_array(tensor):
    """A numpy view of `tensor`'s values (on the CPU), or `tensor` itself where numpy has no
    such dtype (bfloat16)."""
    try:
        return _TensorValues(tensor.cpu().numpy())
    except TypeError:
        return tensor


def _mapped(value, function, kind=torch.Tensor):
    """`value` (dicts, lists and tuples, as state dicts are) with `function` applied to each
    item of type `kind`."""
    if isinstance(value, kind):
        return function(value)
    if isinstance(value, dict):
        return {key: _mapped(item, function, kind) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mapped(item, function, kind) for item in value)
    return value


def _copied(value, into=None):
    """A copy of `value` (dicts, lists and tuples of tensors and plain values, as state
    dicts are) that shares no tensor with it. Tensors of `into`, an earlier copy, are
    reused where they match in shape, dtype and device."""
    if torch.is_tensor(value):
        if (torch.is_tensor(into) and into.shape == value.shape and into.dtype == value.dtype
                and into.device == value.device):
            return into.copy_(value.detach())
        return value.detach().clone()
    if isinstance(value, dict):
        into = into if isinstance(into, dict) else {}
        return {key: _copied(item, into.get(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        into = into if isinstance(into, (list, tuple)) and len(into) == len(value) else [None] * len(value)
        return type(value)(_copied(item, old) for item, old in zip(value, into))
    return copy.deepcopy(value)


class TorchState(State):
    """A model, an optimizer and any other values (ElasticSamplers among them) that roll
    back together; each keyword becomes an attribute (`state.epoch`)."""

    def __init__(self, model: torch.nn.Module = None, optimizer: torch.optim.Optimizer = None, **values):
        super().__init__(handler_for=_handler_for)
        if model is not None:
            self._track("model", model)
        if optimizer is not None:
            self._track("optimizer", optimizer)
        for name, value in values.items():
            self._track(name, value)

    def commit(self) -> None:
        """Save every value (see State.commit); with a LocalSGD or DiLoCo optimizer, only where
        it has `averaged`, else ValueError, naming the last step and the next averaging point.

        A re-formed job resumes from one rank's copy of the commit, on every rank. Between
        averaging points each rank's parameters are its own, so a commit there would make
        every rank resume from one rank's local model, dropping the others' local steps: a
        state that no run of the algorithm reaches. Refusing, rather than quietly skipping
        such commits, keeps every commit the user asked for a real one (a period that does
        not divide the commit interval would otherwise never commit). Every rank counts the
        same steps, so every rank raises alike and none waits in the commit's collectives."""
        for name in self._handlers:
            require_averaged = getattr(getattr(self, name), "_hvdplus_require_averaged", None)
            if require_averaged is not None:
                require_averaged(f"TorchState.commit() of {name!r}")
        super().commit()

    def reset(self) -> None:
        for name in self._handlers:
            value = getattr(self, name)
            if isinstance(value, ElasticSampler):
                value.reset()
