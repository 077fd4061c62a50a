"""Every exception hvdplus raises on purpose, in one place.

Messages say what the user did, what was expected, and on which ranks, because
an error seen on rank 0 is often caused by rank 3.
"""

__all__ = [
    "HvdplusError",
    "NotInitializedError",
    "TensorMismatchError",
    "input_error_class",
]


class HvdplusError(RuntimeError):
    """Base class of hvdplus' own runtime errors."""


class NotInitializedError(HvdplusError, ValueError):
    """A query or collective ran before `hvdplus.init()` (ValueError, as in Horovod)."""

    def __init__(self, what: str = ""):
        suffix = f" (while calling {what})" if what else ""
        super().__init__(f"hvdplus has not been initialized; call hvdplus.init() first{suffix}")


class TensorMismatchError(HvdplusError, ValueError):
    """Ranks submitted the same named collective with different arguments."""


def input_error_class(type_name: str):
    """The exception class to raise, on every rank, for an input error one rank reported.

    Every rank must leave a collective together, or the ones that went on would wait forever;
    so a bad argument on one rank is raised as the same ValueError or TypeError on all of them.
    """
    return TypeError if type_name == "TypeError" else ValueError
