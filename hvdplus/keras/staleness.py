"""Bounded staleness 1 for Keras 3's DistributedOptimizer: step t applies the gradients averaged
in step t-1, while step t's all-reduce runs behind step t+1's forward and backward; step 0
applies nothing (the optimizer's iterations and state start with step 1), as hvdplus.torch's
`DistributedOptimizer(staleness=1)`.

The gradients cross to the host between the step's two halves: Keras' torch trainer applies
them eagerly, and on jax hvdplus' split step (backends/jax.py) has them as concrete arrays
between its compiled halves. Each step's are copied (the next backward overwrites them) and
submitted as one fused all-reduce; two steps' all-reduces are in flight at once, so their
names carry the step's parity.

Not on the tensorflow backend: Keras compiles the whole step, the all-reduce included, into one
tf.function, so the gradients would have to cross between two runs of the graph through a host
op on every step, and step 0's "apply nothing" would put the whole update under a tf.cond. Nor
where jax traces the all-reduce into the step (a train_step of one's own, keras.distribution):
the step there has no host side to keep the previous step's gradients.
"""

import keras
import numpy as np

from ..common.staleness import staleness_setting
from ..core import collectives

__all__ = ["DelayedGradients", "checked_staleness"]


def checked_staleness(staleness, backend: str, weighted: bool, passes: int) -> int:
    """`staleness` as an int, 0 or 1; ValueError for another value, or for 1 with what it does
    not serve, NotImplementedError for 1 on a backend it does not run on."""
    if not staleness_setting(staleness):
        return 0
    if backend == "tensorflow":
        raise NotImplementedError(
            "DistributedOptimizer(staleness=1) runs on Keras' torch and jax backends: on tensorflow the training "
            "step, all-reduce included, is one compiled graph with no host side to keep the previous step's "
            "gradients; use staleness=0, or hvdplus.keras.callbacks.LocalSGDCallback")
    if weighted:
        raise ValueError("DistributedOptimizer(staleness=1): weighted averages (local_samples=, load_balancer=) of "
                         "delayed gradients are not supported; use staleness=0")
    if passes > 1:
        raise ValueError(f"DistributedOptimizer(staleness=1, backward_passes_per_step={passes}): gradient "
                         "accumulation with delayed gradients is not supported")
    return 1


class DelayedGradients:
    """The all-reduce in flight from the last step, and the step count whose parity names it."""

    # Each name in flight, and the DelayedGradients that submitted it. The last step's
    # all-reduce stays in flight when fit ends (the next fit applies it); an optimizer made
    # after that one submits the same name, so it first waits for the older one's and leaves
    # the result with it. The names stay those every rank makes alike.
    _holders = {}

    def __init__(self, name: str):
        self.name = name
        self.steps_sent = 0
        self._in_flight = None  # (its name, a handle or the waited arrays, indices of the present gradients, count)

    def _settle(self) -> None:
        """Wait for the all-reduce in flight, keeping its result for the next exchange."""
        name, result, present, count = self._in_flight
        if not isinstance(result, list):
            self._in_flight = (name, result.wait(), present, count)
        if DelayedGradients._holders.get(name) is self:
            del DelayedGradients._holders[name]

    def exchange(self, grads, reduction, process_set):
        """Submit `grads`' all-reduce (copies, as numpy) and return the previous step's
        averaged gradients as backend tensors, None where a gradient was None; None in the
        first step, which applies nothing.

        Args:
            grads: this step's gradients, backend tensors or None, in the optimizer's order.
            reduction: (op, prescale, postscale).
            process_set: the ranks that average (None: the job).
        """
        present = [i for i, g in enumerate(grads) if g is not None]
        arrays = [np.array(keras.ops.convert_to_numpy(grads[i])) for i in present]  # copies
        op, prescale, postscale = reduction
        name = f"{self.name}.{self.steps_sent % 2}"
        holder = DelayedGradients._holders.get(name)
        if holder is not None and holder is not self:
            holder._settle()
        handle = collectives.grouped_allreduce_async(arrays, name, op, prescale, postscale, process_set=process_set)
        if self._in_flight is not None:
            self._settle()
        previous, self._in_flight = self._in_flight, (name, handle, present, len(grads))
        DelayedGradients._holders[name] = self
        self.steps_sent += 1
        if previous is None:
            return None
        _, averaged_arrays, present, count = previous
        averaged = [None] * count
        for index, array in zip(present, averaged_arrays):
            averaged[index] = keras.ops.convert_to_tensor(array)
        return averaged
