"""DiLoCo (Douillard et al., 2023): local inner steps, and every `period` of them an outer step
on the change of the parameters averaged over the ranks.

The inner optimizer steps on each rank's own gradients. After every `period` inner steps, each
rank takes delta = theta_outer - theta (its parameters' change since the last outer step, as a
descent direction), the ranks average it with one grouped all-reduce per dtype and device, and
every rank sets its parameters back to theta_outer, gives each the averaged delta as its
gradient and steps the outer optimizer (by default SGD with Nesterov momentum 0.9 and a
learning rate of 0.7, the paper's). The result is the next theta_outer, the same on every rank.
The inner optimizers' states stay local.

The step counting is hvdplus/common/averaging_schedule.py's; the ranks compare the step before
each averaging, as PeriodicModelAverager does, so a rank out of step raises on every rank.
"""

import torch

from ..common.averaging_schedule import AveragingSchedule
from ..core.process_sets import global_process_set
from ..core.rank_agreement import require_same
from .model_averaging import AveragingPoints, OptimizerWrapper, average_in_place, named_tensors
from .optimizer import _averages_here, wrapped_in

__all__ = ["DiLoCo"]

# The outer optimizer of the DiLoCo paper.
_OUTER_LR, _OUTER_MOMENTUM = 0.7, 0.9


class _DiLoCo(AveragingPoints, OptimizerWrapper):
    """Mixed in before the inner optimizer's class, as DistributedOptimizer is."""

    def _diloco_setup(self, model_or_params, outer_optimizer, period, process_set, name):
        self._diloco_schedule = AveragingSchedule.after_every(period, "DiLoCo")
        self._diloco_named = named_tensors(model_or_params)
        self._diloco_process_set = process_set
        self._diloco_name = name
        self._diloco_step = 0
        self._diloco_here = _averages_here(process_set)
        if self._diloco_here:
            require_same({"period": self._diloco_schedule.period}, f"{name}.settings", "DiLoCo", process_set)
        params = [p for _, p in self._diloco_named]
        # theta_outer: the parameters as the first step finds them (after the user's
        # broadcast_parameters, which may come after this wrapper is made), or as loaded.
        self._diloco_outer_params = None
        if outer_optimizer is None:
            outer_optimizer = torch.optim.SGD(params, lr=_OUTER_LR, momentum=_OUTER_MOMENTUM, nesterov=True)
        elif not isinstance(outer_optimizer, torch.optim.Optimizer) and callable(outer_optimizer):
            outer_optimizer = outer_optimizer(params)
        self.outer_optimizer = outer_optimizer

    def step(self, closure=None):
        if self._diloco_outer_params is None:
            self._diloco_outer_params = [p.detach().clone() for _, p in self._diloco_named]
        loss = super().step(closure)
        step, self._diloco_step = self._diloco_step, self._diloco_step + 1
        if self._diloco_here and self._diloco_schedule.averages_after(step):
            self._diloco_outer_step(step)
        return loss

    def _diloco_outer_step(self, step):
        name, process_set = self._diloco_name, self._diloco_process_set
        require_same({"step": step}, f"{name}.round", "DiLoCo", process_set)
        deltas = [(n, outer - p.detach()) for (n, p), outer in zip(self._diloco_named, self._diloco_outer_params)]
        average_in_place(deltas, f"{name}.{step}", process_set)
        with torch.no_grad():
            for (_, param), outer, (_, delta) in zip(self._diloco_named, self._diloco_outer_params, deltas):
                param.copy_(outer)
                param.grad = delta
        self.outer_optimizer.step()
        with torch.no_grad():
            for (_, param), outer in zip(self._diloco_named, self._diloco_outer_params):
                outer.copy_(param)
                # The next inner step's gradients come from its own backward.
                param.grad = None

    _own_state_key = "diloco"

    def _averaging_position(self):
        return self._diloco_schedule, self._diloco_step, "DiLoCo"

    def _own_state(self):
        outer_params = None if self._diloco_outer_params is None else [p.clone() for p in self._diloco_outer_params]
        return {"step": self._diloco_step, "outer_params": outer_params,
                "outer_optimizer": self.outer_optimizer.state_dict()}

    def _load_own_state(self, state):
        self._diloco_step = int(state["step"])
        saved = state["outer_params"]
        self._diloco_outer_params = None if saved is None else [
            p.detach().clone().to(device=param.device, dtype=param.dtype)
            for p, (_, param) in zip(saved, self._diloco_named)]
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])


def DiLoCo(inner_optimizer, model_or_params, outer_optimizer=None, period=500, process_set=global_process_set,
           name="diloco"):
    """Wrap `inner_optimizer` for DiLoCo: its steps are local, and after every `period` of
    them an outer optimizer steps on the change of the parameters averaged over the ranks.

    theta_outer starts as the parameters the first step() finds, which must be the same on
    every rank: broadcast them first (hvd.broadcast_parameters), as for DistributedOptimizer.

    Args:
        inner_optimizer: any torch.optim optimizer (the paper's is AdamW); its state stays local.
        model_or_params: the model, its named_parameters(), or a list of its parameters: those
            the outer optimizer updates, the same on every rank.
        outer_optimizer: an optimizer over those parameters, or a function that makes one from
            the list of them (default: SGD, lr 0.7, Nesterov momentum 0.9).
        period: inner steps between two outer steps (the paper's H; 500 there).
        process_set: the ranks that average (default: every rank); a rank outside it trains
            on its own.
        name: the prefix of the collectives' names.
    """
    wrapped = wrapped_in(inner_optimizer, _DiLoCo)
    wrapped._diloco_setup(model_or_params, outer_optimizer, period, process_set, name)
    return wrapped
