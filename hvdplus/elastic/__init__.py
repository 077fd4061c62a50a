"""Elastic training: a job that survives the death of a rank and grows when slots appear.

    state = hvdplus.elastic.ObjectState(epoch=0, batch=0)

    @hvdplus.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

The framework adapters add states for their models (`hvdplus.torch.elastic.TorchState`,
`hvdplus.tensorflow.elastic.TensorFlowKerasState`, `hvdplus.keras.elastic.KerasState`).
See docs/elastic.md for the three ways a job re-forms.
"""

from ..common.errors import HorovodInternalError, HostsUpdatedInterrupt, RanksFailedError
from .run import run
from .state import ObjectHandler, ObjectState, State

__all__ = ["run", "State", "ObjectState", "ObjectHandler", "HostsUpdatedInterrupt", "RanksFailedError",
           "HorovodInternalError"]
