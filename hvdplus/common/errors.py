"""Every exception hvdplus raises on purpose, in one place.

Messages say what the user did, what was expected, and on which ranks, because
an error seen on rank 0 is often caused by rank 3.
"""

__all__ = [
    "HvdplusError",
    "NotInitializedError",
    "TensorMismatchError",
    "CollectiveArgumentError",
    "ShutdownError",
    "StalledError",
    "RanksFailedError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "input_error_class",
    "error_to_wire",
    "error_from_wire",
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


class CollectiveArgumentError(ValueError, RuntimeError):
    """A collective's argument was refused on some rank (a reducescatter with op Adasum, a
    root rank out of range), raised on every rank of the collective. A ValueError, and also a
    RuntimeError, the class Horovod's core gives such errors; not an HvdplusError, so that the
    adapters keep treating it as the caller's mistake rather than the job's."""


class ShutdownError(HvdplusError):
    """An operation could not complete because hvdplus was shut down on some rank."""


class StalledError(HvdplusError):
    """Ranks waited on a tensor longer than HVDPLUS_STALL_SHUTDOWN_TIME_SECONDS."""


class RanksFailedError(HvdplusError):
    """Ranks of the job died, so the operation could not complete (Horovod's
    HorovodInternalError). Under `hvdplus.elastic.run` the job re-forms on the survivors
    and the state rolls back to its last commit; elsewhere it ends the job."""

    def __init__(self, message: str, ranks=()):
        super().__init__(message)
        self.ranks = tuple(ranks)

    @classmethod
    def seen_on(cls, rank: int, size: int, failed, what: str = "") -> "RanksFailedError":
        """The error rank `rank` of a `size`-rank job raises when it sees ranks `failed` die
        (empty: it learnt of a death from another rank); `what` names the operation."""
        who = f"ranks {list(failed)}" if failed else "a rank"
        prefix = f"{what}: " if what else ""
        return cls(f"{prefix}{who} of the {size}-rank job failed (seen on rank {rank})", failed)


# Horovod's name for it, so that `except hvd.HorovodInternalError` keeps working.
HorovodInternalError = RanksFailedError


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed (slots were added), so the job re-forms at this commit.

    Args:
        skip_sync: True when no rank's state changed since the last sync, so the state
            need not be broadcast again after the re-form.
    """

    def __init__(self, skip_sync: bool = False, message: str = "the job's hosts changed"):
        super().__init__(message)
        self.skip_sync = skip_sync


_WIRE_CLASSES = {cls.__name__: cls for cls in (
    TypeError, ValueError, CollectiveArgumentError, HvdplusError, TensorMismatchError, ShutdownError, StalledError,
    RanksFailedError,
)}


def error_to_wire(exc: BaseException):
    """A picklable (class name, message) pair that `error_from_wire` turns back into `exc`."""
    return (type(exc).__name__, str(exc))


def error_from_wire(wire) -> BaseException:
    type_name, message = wire
    return _WIRE_CLASSES.get(type_name, HvdplusError)(message)


def input_error_class(type_name: str):
    """The exception class to raise, on every rank, for an input error one rank reported.

    Every rank must leave a collective together, or the ones that went on would wait forever;
    so a bad argument on one rank is raised as the same TypeError or CollectiveArgumentError
    (a ValueError) on all of them.
    """
    return TypeError if type_name == "TypeError" else CollectiveArgumentError
