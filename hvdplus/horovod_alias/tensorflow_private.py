"""The private names of Horovod's TensorFlow modules that programs copied from Horovod's own
tests call (`hvd._executing_eagerly()`, `hvd.mpi_ops._basics._get_process_set_ids_and_ranks()`),
served to `horovod.tensorflow` and its submodules by the alias only: hvdplus.tensorflow keeps
them off its own surface.
"""

import tensorflow as tf

from hvdplus.core import runtime

__all__ = ["PRIVATE_NAMES"]


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs ops at once (not inside a tf.function or a tf.compat.v1 graph)."""
    return tf.executing_eagerly()


class _Basics:
    """The part of Horovod's `mpi_ops._basics` its tests read."""

    @staticmethod
    def _get_process_set_ids_and_ranks():
        """{process set id: its job ranks} for every set hvdplus holds, the job's (0) included."""
        job = runtime.current("_get_process_set_ids_and_ranks()")
        return {set_id: list(ranks) for set_id, ranks in sorted(job.process_set_ranks.items())}


# Horovod's module -> the private names it holds; `horovod.tensorflow.util` is a module of its
# own in Horovod, and `hvd.util`, `hvd.mpi_ops` are those submodules.
PRIVATE_NAMES = {
    "horovod.tensorflow": {"_executing_eagerly": _executing_eagerly},
    "horovod.tensorflow.mpi_ops": {"_executing_eagerly": _executing_eagerly, "_basics": _Basics()},
    "horovod.tensorflow.util": {"_executing_eagerly": _executing_eagerly},
}
