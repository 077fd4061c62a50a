"""Periodic model averaging (local SGD, post-local SGD) on hvdplus' all-reduce.

`PeriodicModelAverager` averages a model's parameters over the ranks every `period` steps once
`warmup_steps` have passed, for users' own loops; `LocalSGD` wraps an optimizer so that its
first `warmup_steps` steps average the gradients (synchronous training) and the later ones run
locally, with the parameters (and optionally the optimizer's floating state) averaged every
`period` steps, as torch's `PostLocalSGDOptimizer` does with DDP's post-local SGD hook. The step
counting is hvdplus/common/averaging_schedule.py's.

Each averaging is one grouped all-reduce per dtype and device, named with the step it averages
after ("local_sgd.<step>.<first parameter>"), so a timeline shows each averaging round. Before it,
the ranks compare that step (one all-gather of a number, hvdplus/core/rank_agreement.py): a rank
that averages at another step than the others raises ValueError on every rank, naming the ranks
and their steps, rather than waiting for names no other rank submits. The settings are compared
the same way when an averager is made. The step names never repeat, so past the response
cache's capacity (HVDPLUS_CACHE_CAPACITY) they are negotiated in full, as new names are.
"""

import numbers

import torch

from ..common.averaging_schedule import AveragingSchedule
from ..common.reduce_ops import Average
from ..core.process_sets import global_process_set
from ..core.rank_agreement import require_same
from .mpi_ops import grouped_allreduce_async_
from .optimizer import _averages_here, _parameter_names, wrapped_in

__all__ = ["PeriodicModelAverager", "LocalSGD", "named_tensors", "average_in_place", "OptimizerWrapper",
           "AveragingPoints"]


def named_tensors(params_or_module):
    """[(name, tensor)] of a module (its named_parameters()), of (name, tensor) pairs, or of
    tensors (named "param.<index>")."""
    if isinstance(params_or_module, torch.nn.Module):
        return list(params_or_module.named_parameters())
    items = list(params_or_module)
    if all(isinstance(item, tuple) and len(item) == 2 for item in items):
        return [(str(name), tensor) for name, tensor in items]
    if all(isinstance(item, torch.Tensor) for item in items):
        return [(f"param.{index}", tensor) for index, tensor in enumerate(items)]
    raise ValueError("expected a torch.nn.Module, model.named_parameters() or a list of tensors")


def average_in_place(named, name, process_set=global_process_set):
    """Average each of `named`'s (name, tensor) pairs over `process_set`'s ranks, in place: one
    grouped all-reduce per dtype and device, named "<name>.<its first tensor's name>".

    Args:
        named: (name, tensor) pairs, in the same order on every rank.
        name: the prefix of the all-reduces' names, the same on every rank.
        process_set: the ranks that average (default: every rank).
    """
    groups = {}
    for tensor_name, tensor in named:
        groups.setdefault((tensor.dtype, tensor.device), []).append((tensor_name, tensor))
    handles = [grouped_allreduce_async_([tensor.data for _, tensor in members], name=f"{name}.{members[0][0]}",
                                        op=Average, process_set=process_set)
               for members in groups.values()]
    for handle in handles:
        handle.wait()


def _step_number(step) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"average_parameters(step): step must be an integer of at least 0, got {step!r}")
    return int(step)


class PeriodicModelAverager:
    """Averages parameters over the ranks every `period` steps after `warmup_steps`.

        averager = hvd.PeriodicModelAverager(model, period=4, warmup_steps=100)
        for step in range(steps):
            ...forward, backward, optimizer.step() (local)...
            averager.average_parameters(step)

    Args:
        params_or_module: a torch.nn.Module, its named_parameters(), or a list of tensors; the
            same parameters in the same order on every rank.
        period: steps between two averagings.
        warmup_steps: steps before the first averaging, which comes after step `warmup_steps`.
        process_set: the ranks that average (default: every rank); a rank outside it keeps
            its own parameters.
        name: the prefix of the collectives' names; give averagers that run in one program
            names of their own.
        what: the caller that errors name (LocalSGD passes its own).
    """

    def __init__(self, params_or_module, period, warmup_steps=0, process_set=global_process_set, name="local_sgd",
                 what="PeriodicModelAverager"):
        self.schedule = AveragingSchedule(period, warmup_steps, what)
        self.named = named_tensors(params_or_module)
        self.process_set = process_set
        self.name = name
        self.what = what
        self.step = 0  # the step the next average_parameters() call stands for, without one given
        self.averages_here = _averages_here(process_set)
        if self.averages_here:
            require_same({"period": self.schedule.period, "warmup_steps": self.schedule.warmup_steps},
                         f"{name}.settings", what, process_set)

    @property
    def period(self) -> int:
        return self.schedule.period

    @property
    def warmup_steps(self) -> int:
        return self.schedule.warmup_steps

    def average_parameters(self, step=None, extra=()) -> bool:
        """Average the parameters if the schedule says so after `step`; returns whether it did.

        Args:
            step: the step just taken, counted from 0 (default: one more than the last call's,
                starting at 0, as torch's averager counts its calls).
            extra: more (name, tensor) pairs averaged with the parameters, such as optimizer
                state; the same on every rank.
        """
        step = self.step if step is None else _step_number(step)
        self.step = step + 1
        if not (self.averages_here and self.schedule.averages_after(step)):
            return False
        require_same({"step": step}, f"{self.name}.round", self.what, self.process_set)
        average_in_place([*self.named, *extra], f"{self.name}.{step}", self.process_set)
        return True


class OptimizerWrapper:
    """For optimizer wrappers whose step() does more than the wrapped optimizer's and that have
    a state of their own: `state_dict()` carries that state under `_own_state_key` beside the
    wrapped optimizer's, `load_state_dict()` restores it, and `_hvdplus_local_step()` is the
    wrapped optimizer's step alone (broadcast_optimizer_state primes a fresh optimizer so, on
    the ranks that need it)."""

    _own_state_key = "own_state"

    def _hvdplus_local_step(self):
        return super().step()

    def state_dict(self):
        state = super().state_dict()
        state[self._own_state_key] = self._own_state()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        own = state_dict.pop(self._own_state_key, None)
        super().load_state_dict(state_dict)
        if own is not None:
            self._load_own_state(own)


class AveragingPoints:
    """For optimizer wrappers whose ranks train apart between averaging points (LocalSGD,
    DiLoCo): `averaged` tells whether the ranks hold the same parameters now, the only moments
    at which a commit of hvd.elastic is a state of the whole job. A subclass gives
    `_averaging_position()`: its schedule, the steps it has taken, and its name."""

    def _averaging_position(self):
        raise NotImplementedError

    @property
    def averaged(self) -> bool:
        """True where the ranks hold the same parameters, by the schedule (the same on every
        rank): before the first step(), and after a step() that averaged the gradients (a
        warm-up step) or the parameters (an averaging point). Commit elastic states then:
        `if optimizer.averaged: state.commit()`."""
        schedule, steps, _ = self._averaging_position()
        return schedule.agreed_after(steps)

    def _hvdplus_require_averaged(self, what):
        """Raise ValueError, naming the step and the next averaging point, unless `averaged`."""
        schedule, steps, name = self._averaging_position()
        error = schedule.between_averages(steps, f"{what} with {name}")
        if error is not None:
            raise ValueError(f"{error}; commit where optimizer.averaged is True")


class _LocalSGD(AveragingPoints, OptimizerWrapper):
    """Mixed in before the user's optimizer class, as DistributedOptimizer is, so the wrapped
    optimizer stays an instance of that class (schedulers, state_dict and isinstance keep
    working)."""

    def _local_sgd_setup(self, named_parameters, period, warmup_steps, average_optimizer_state, process_set, name):
        params = [p for group in self.param_groups for p in group["params"]]
        if isinstance(named_parameters, torch.nn.Module):
            named_parameters = named_parameters.named_parameters()
        self._local_sgd_names = _parameter_names(params, named_parameters)
        self._local_sgd_params = params
        self._local_sgd_average_state = bool(average_optimizer_state)
        self._local_sgd_averager = PeriodicModelAverager(
            [(self._local_sgd_names[p], p) for p in params], period, warmup_steps, process_set, name, "LocalSGD")

    def _local_sgd_gradients(self):
        """The named gradients to average in a synchronous step (zeros where none came)."""
        named = []
        for param in self._local_sgd_params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            named.append((self._local_sgd_names[param], param.grad))
        return named

    def _local_sgd_state(self):
        """The optimizer's floating state tensors of each parameter's shape (momentum buffers,
        Adam's moments), named "state.<parameter>.<key>"; step counts are left alone."""
        named = []
        for param in self._local_sgd_params:
            for key, value in sorted(self.state.get(param, {}).items()):
                if (isinstance(value, torch.Tensor) and value.is_floating_point() and value.shape == param.shape
                        and key != "step"):
                    named.append((f"state.{self._local_sgd_names[param]}.{key}", value))
        return named

    def step(self, closure=None):
        averager = self._local_sgd_averager
        step = averager.step
        if averager.averages_here and averager.schedule.synchronous(step):
            if closure is not None:
                raise ValueError("LocalSGD.step(closure): a closure's gradients are not averaged; "
                                 "call backward before step() in the synchronous warm-up steps")
            average_in_place(self._local_sgd_gradients(), f"{averager.name}.grads", averager.process_set)
        loss = super().step(closure)
        averager.average_parameters(step, self._local_sgd_state() if self._local_sgd_average_state else ())
        return loss

    _own_state_key = "local_sgd_step"

    def _averaging_position(self):
        averager = self._local_sgd_averager
        return averager.schedule, averager.step, "LocalSGD"

    def _own_state(self):
        return self._local_sgd_averager.step

    def _load_own_state(self, step):
        self._local_sgd_averager.step = int(step)


def LocalSGD(optimizer, model_or_named_parameters=None, period=1, warmup_steps=0, average_optimizer_state=False,
             process_set=global_process_set, name="local_sgd"):
    """Wrap `optimizer` for post-local SGD: its first `warmup_steps` steps apply gradients
    averaged over the ranks; later steps are local, and after steps warmup_steps,
    warmup_steps + period, ... the parameters are averaged (torch's PostLocalSGDOptimizer).

    Args:
        optimizer: any torch.optim optimizer; its state and hooks carry over.
        model_or_named_parameters: the model or its `named_parameters()`, to name the
            collectives (default: "param.<index>").
        period: steps between two averagings of the parameters (1: every step).
        warmup_steps: synchronous steps first (0: none).
        average_optimizer_state: also average the optimizer's floating per-parameter state
            (momentum buffers, Adam's moments) when the parameters are averaged.
        process_set: the ranks that average (default: every rank); a rank outside it trains
            on its own.
        name: the prefix of the collectives' names.
    """
    wrapped = wrapped_in(optimizer, _LocalSGD)
    wrapped._local_sgd_setup(model_or_named_parameters, period, warmup_steps, average_optimizer_state,
                             process_set, name)
    return wrapped
