"""Local SGD and DiLoCo in Keras 3 `model.fit`, on every backend: callbacks that average the
model on the host at the end of a batch.

Why callbacks rather than an optimizer wrapper: an averaging of the parameters comes after the
optimizer's update, once every H steps, and is decided by a step count. Inside Keras' compiled
step (tf.function, jax.jit) that count is a traced value, so an optimizer would have to run a
host op (or a host callback) on every step, averaging or not, to decide. Between two steps the
variables are plain arrays on every backend (on jax, `Callback.model` writes the step's state
back to them first, and the next step reads them again), so a callback averages them with the
core's numpy all-reduce, and the steps between averagings run Keras' own compiled step
untouched. The warm-up steps of local SGD average the gradients, which only the step can do:
they run `hvd.DistributedOptimizer`, which the callback switches to local steps (recompiling
the step once) when the warm-up ends.

The step counting is hvdplus/common/averaging_schedule.py's, as in torch's LocalSGD and DiLoCo;
steps count the training batches this callback has seen, over every `fit` it is given to. The
ranks compare the settings once (at the first `on_train_begin`) and the step before each
averaging (hvdplus/core/rank_agreement.py): a rank that averages at another step than the
others raises ValueError on every rank, naming the ranks and their steps.
"""

import keras
import numpy as np

from ..common.averaging_schedule import AveragingSchedule
from ..common.reduce_ops import Average
from ..core import collectives
from ..core.process_sets import global_process_set, is_job
from ..core.rank_agreement import require_same

__all__ = ["LocalSGDCallback", "DiLoCoCallback", "average_arrays", "optimizer_state"]


def average_arrays(arrays, name, process_set=None):
    """The ranks' average of each of `arrays` (numpy, the same shapes and dtypes in the same
    order on every rank), in one fused all-reduce named `name`; returns a list.

    Args:
        arrays: numpy arrays.
        name: the all-reduce's name, the same on every rank.
        process_set: the ranks that average (None: every rank).
    """
    return collectives.grouped_allreduce([np.ascontiguousarray(a) for a in arrays], op=Average, name=name,
                                         process_set=process_set)


def _values(variables):
    """The variables' values as numpy arrays of their own."""
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def _assign(variables, arrays):
    for variable, array in zip(variables, arrays):
        variable.assign(array)


def _reduces_gradients(optimizer) -> bool:
    """Whether `optimizer` is an hvdplus DistributedOptimizer."""
    return hasattr(optimizer, "_hvdplus_pause")


class _AveragingCallback(keras.callbacks.Callback):
    """What LocalSGDCallback and DiLoCoCallback share: the schedule, the step count, the
    settings compared once, and the step compared before each averaging."""

    def __init__(self, schedule, process_set, name, what):
        super().__init__()
        self.schedule = schedule
        self.process_set = process_set
        self.name = name
        self.what = what
        self.step = 0  # the step the next batch stands for; set it to resume a count
        self._compared = False
        self.averages_here = is_job(process_set) or process_set.included()

    def _ranks(self):
        return None if is_job(self.process_set) else self.process_set

    def _begin(self, model, distributed):
        """At the start of training: every rank's settings alike (compared once, with whether
        the model's optimizer is a DistributedOptimizer), else ValueError on every rank; then
        one optimizer step per batch, else ValueError."""
        per_execution = getattr(model, "steps_per_execution", 1) or 1
        accumulated = getattr(model.optimizer, "gradient_accumulation_steps", None) or 1
        if self.averages_here and not self._compared:
            settings = {"period": self.schedule.period, "warmup_steps": self.schedule.warmup_steps,
                        "DistributedOptimizer": distributed, "steps_per_execution": per_execution,
                        "gradient_accumulation_steps": accumulated}
            require_same(settings, f"{self.name}.settings", self.what, self._ranks())
            self._compared = True
        # With steps_per_execution > 1 a batch's callbacks come once per several optimizer
        # steps, and with gradient accumulation an optimizer step once per several batches:
        # the count would not be the optimizer's steps.
        if per_execution != 1:
            raise ValueError(f"{self.what}: compile the model with steps_per_execution=1 (it has {per_execution}): "
                             "the averagings follow each batch")
        if accumulated != 1:
            raise ValueError(f"{self.what}: the optimizer accumulates gradients over {accumulated} batches; the "
                             "averagings follow each batch")

    def _averages_after(self, step) -> bool:
        """Whether to average after `step`, having checked that every rank averages there."""
        if not (self.averages_here and self.schedule.averages_after(step)):
            return False
        require_same({"step": step}, f"{self.name}.round", self.what, self._ranks())
        return True

    def on_train_batch_end(self, batch, logs=None):
        step, self.step = self.step, self.step + 1
        if self._averages_after(step):
            self._average(self.model, step)  # on jax, `self.model` writes the step's state back first


class LocalSGDCallback(_AveragingCallback):
    """Post-local SGD in `model.fit`: the first `warmup_steps` batches train synchronously, and
    later ones locally, with the trainable variables (and, optionally, the optimizer's state)
    averaged over the ranks after batches warmup_steps, warmup_steps + period, ... (torch's
    `PostLocalSGDOptimizer`, and hvdplus.torch.LocalSGD).

        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=...)
        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.LocalSGDCallback(period=4, warmup_steps=100)])

    The warm-up averages the gradients, so with `warmup_steps` > 0 the model's optimizer must
    be `hvd.DistributedOptimizer`; the callback turns its all-reduce off when the warm-up ends
    (Keras compiles the training step again, once). Without a warm-up a plain optimizer does.

    Args:
        period: batches between two averagings (1: after every batch).
        warmup_steps: synchronous batches first (0: none).
        average_optimizer_state: also average the optimizer's floating variables of a trained
            variable's shape (SGD's momentums, Adam's moments) when the model is averaged; the
            iteration count and the learning rate are left alone.
        process_set: the ranks that average (default: every rank); a rank outside it trains on
            its own.
        name: the prefix of the collectives' names; give callbacks that run in one program
            names of their own.
    """

    def __init__(self, period, warmup_steps=0, average_optimizer_state=False, process_set=global_process_set,
                 name="local_sgd"):
        super().__init__(AveragingSchedule(period, warmup_steps, "LocalSGDCallback"), process_set, name,
                         "LocalSGDCallback")
        self.average_optimizer_state = bool(average_optimizer_state)

    def on_train_begin(self, logs=None):
        model = self.model
        distributed = _reduces_gradients(model.optimizer)
        self._begin(model, distributed)
        if self.schedule.warmup_steps > self.step and not distributed:
            raise ValueError(f"LocalSGDCallback(warmup_steps={self.schedule.warmup_steps}): the warm-up steps "
                             "average the gradients; compile the model with hvd.DistributedOptimizer(optimizer)")
        self._follow_schedule(model)

    def on_train_batch_begin(self, batch, logs=None):
        if self.step == self.schedule.warmup_steps:
            self._follow_schedule(self.model)

    def _follow_schedule(self, model):
        """Let a DistributedOptimizer all-reduce the gradients in warm-up steps only."""
        optimizer = model.optimizer
        if _reduces_gradients(optimizer) and optimizer._hvdplus_pause(not self.schedule.synchronous(self.step)):
            # The compiled step holds the all-reduce (or not) as it was when traced.
            model.make_train_function(force=True)

    def _average(self, model, step):
        variables = list(model.trainable_variables)
        if self.average_optimizer_state:
            variables += optimizer_state(model.optimizer, model.trainable_variables)
        _assign(variables, average_arrays(_values(variables), f"{self.name}.{step}", self._ranks()))


def optimizer_state(optimizer, trainable_variables):
    """The optimizer's floating variables of a trained variable's shape: its per-variable
    state (momentums, Adam's moments), without the iteration count, the learning rate, or
    accumulated gradients."""
    left_out = {id(optimizer.iterations)}
    for attribute in ("_learning_rate", "_accumulated_gradients"):
        value = getattr(optimizer, attribute, None)
        for variable in value if isinstance(value, (list, tuple)) else [value]:
            left_out.add(id(variable))
    shapes = {tuple(v.shape) for v in trainable_variables}
    return [v for v in optimizer.variables
            if id(v) not in left_out and tuple(v.shape) in shapes and "float" in str(v.dtype)]


class DiLoCoCallback(_AveragingCallback):
    """DiLoCo (Douillard et al., 2023) in `model.fit`: the model's optimizer takes local inner
    steps, and after every `period` of them each rank takes delta = theta_outer - theta (its
    trainable variables' change since the last outer step), the ranks average it, and every
    rank sets its variables back to theta_outer and steps `outer_optimizer` on them with the
    averaged delta as the gradient; the result is the next theta_outer, the same on every rank.
    The inner optimizer's state stays local (as hvdplus.torch.DiLoCo).

        model.compile(optimizer=keras.optimizers.AdamW(4e-4), loss=...)   # plain: local steps
        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.DiLoCoCallback(period=500)])

    theta_outer starts as the variables the first batch finds, which must be the same on every
    rank: put BroadcastGlobalVariablesCallback before this callback.

    Args:
        period: inner steps between two outer steps (the paper's H; 500 there).
        outer_optimizer: a Keras optimizer for the outer steps, not the model's (default:
            SGD with learning rate 0.7 and Nesterov momentum 0.9, the paper's).
        process_set: the ranks that average (default: every rank); a rank outside it trains on
            its own.
        name: the prefix of the collectives' names.
    """

    def __init__(self, period=500, outer_optimizer=None, process_set=global_process_set, name="diloco"):
        super().__init__(AveragingSchedule.after_every(period, "DiLoCoCallback"), process_set, name,
                         "DiLoCoCallback")
        if outer_optimizer is None:
            outer_optimizer = keras.optimizers.SGD(learning_rate=0.7, momentum=0.9, nesterov=True)
        self.outer_optimizer = outer_optimizer
        self.outer_variables = None  # theta_outer, as numpy arrays, once the first batch has begun

    def on_train_begin(self, logs=None):
        model = self.model
        reduces = _reduces_gradients(model.optimizer)
        self._begin(model, reduces)
        if reduces:
            raise ValueError("DiLoCoCallback: the inner steps are local; compile the model with the plain optimizer, "
                             "not hvd.DistributedOptimizer")
        if self.outer_optimizer is model.optimizer:
            raise ValueError("DiLoCoCallback: the outer optimizer must be another than the model's")

    def on_train_batch_begin(self, batch, logs=None):
        if self.outer_variables is None:
            # After every callback's on_train_begin, BroadcastGlobalVariablesCallback's included.
            self.outer_variables = _values(self.model.trainable_variables)

    def _average(self, model, step):
        variables = model.trainable_variables
        deltas = [outer - value for outer, value in zip(self.outer_variables, _values(variables))]
        deltas = average_arrays(deltas, f"{self.name}.{step}", self._ranks())
        _assign(variables, self.outer_variables)
        self.outer_optimizer.apply([keras.ops.convert_to_tensor(d, dtype=v.dtype) for d, v in zip(deltas, variables)],
                                   variables)
        self.outer_variables = _values(variables)
