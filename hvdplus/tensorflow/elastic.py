"""Elastic training with TensorFlow: `hvd.elastic.TensorFlowState` for tf.Variables, and
`hvd.elastic.TensorFlowKerasState` for a Keras model and its optimizer.

    state = hvd.elastic.TensorFlowState(model.variables + optimizer.variables, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                train_step(...)                  # a tf.function, with DistributedGradientTape
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

Variables roll back as numpy copies and sync by broadcasting the values of the rank with
the newest commit. TensorFlowKerasState is the KerasState of the Keras that tf.keras is:
`hvdplus.keras.elastic.KerasState` for Keras 3 (TensorFlow 2.16+), or
`hvdplus.tensorflow.keras2.elastic.KerasState` for tf_keras under `TF_USE_LEGACY_KERAS=1`.
It is taken from `hvdplus.tensorflow.keras` when a script asks for it, so that
`import hvdplus.tensorflow` loads no Keras (hvdplus.keras sits above this package).
"""

import tensorflow as tf

from ..elastic import HostsUpdatedInterrupt, ObjectHandler, ObjectState, RanksFailedError, State, run
from .functions import broadcast_variables

__all__ = [
    "TensorFlowState", "run", "ObjectState", "State", "HostsUpdatedInterrupt", "RanksFailedError",
    "TensorFlowKerasState",  # noqa: F822 (the module's __getattr__ loads it on first use)
]


class VariablesHandler(ObjectHandler):
    """Keeps numpy copies of a value's tf.Variables, `variables_of(value)` (by default the
    value is a list of them); sync assigns one rank's values."""

    def __init__(self, value, variables_of=list):
        self._variables_of = variables_of
        self.save(value)

    def save(self, value):
        self.saved = [variable.numpy() for variable in self._variables_of(value)]  # .numpy() copies a variable

    def restore(self, value):
        for variable, saved in zip(self._variables_of(value), self.saved):
            variable.assign(saved)
        return value

    def sync(self, value, name, root_rank=0):
        broadcast_variables(self._variables_of(value), root_rank=root_rank)
        return value


def _handler_for(value):
    if isinstance(value, (list, tuple)) and value and all(_is_variable(v) for v in value):
        return VariablesHandler(value)
    return ObjectHandler(value)


def _is_variable(value) -> bool:
    # Keras 3 variables are no tf.Variable, but read and assign alike.
    return isinstance(value, tf.Variable) or (hasattr(value, "assign") and hasattr(value, "numpy"))


class TensorFlowState(State):
    """tf.Variables (`state.variables`) and any other values, as attributes (`state.epoch`),
    that roll back together; a value that is a list of variables is kept as variables too.
    Call it eagerly."""

    def __init__(self, variables=None, **values):
        super().__init__(handler_for=_handler_for)
        self._track("variables", list(variables or []))
        for name, value in values.items():
            self._track(name, value)


def __getattr__(name):
    if name == "TensorFlowKerasState":
        from . import keras

        return keras.elastic.KerasState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
