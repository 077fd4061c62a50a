"""What travels between the ranks' engines: typed values, never dicts keyed by strings.

A rank's engine sends rank 0 a list of items: a `Request` (a new call), the response-cache
id of a request agreed before (an int), or a `Token`. Rank 0 answers every rank with the same
list of `Batch`es, which all ranks execute in that order.
"""

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Tuple, Union

from ..common.reduce_ops import ReduceOp

__all__ = ["Collective", "Token", "Outcome", "GroupLayout", "Agreement", "AGREEMENT_FIELDS",
           "NOTHING_TO_AGREE", "Request", "Batch"]


class _TextEnum(str, enum.Enum):
    """An enum whose members are their own text, formatted and hashed as plain strings (as
    3.11's StrEnum is): messages and names built on every call stay cheap."""

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__


class Collective(str):
    """What a request asks for, and the kind of the batch that runs it: a kind's name, one
    object per name, so kinds compare with `is` and format as plain text.

    A kind exists once it is declared (`Collective.declare`); its spec in `hvdplus.engine.kinds`
    says everything else about it. The kinds that the engine's own code names are declared
    here; a new kind declares itself in its spec module."""

    __slots__ = ()
    _declared: Dict[str, "Collective"] = {}

    def __new__(cls, name: str) -> "Collective":
        known = cls._declared.get(name)
        if known is None:
            raise ValueError(f"{name!r} is not a collective kind; the kinds are {sorted(cls._declared)}")
        return known

    @classmethod
    def declare(cls, name: str) -> "Collective":
        """The kind named `name`, declared once (again: the same object)."""
        known = cls._declared.get(name)
        if known is None:
            known = cls._declared[name] = str.__new__(cls, name)
        return known

    def __reduce__(self):
        return Collective, (str(self),)

    def __repr__(self) -> str:
        return f"Collective({str(self)!r})"


Collective.ALLREDUCE = Collective.declare("allreduce")
Collective.ALLGATHER = Collective.declare("allgather")
Collective.BROADCAST = Collective.declare("broadcast")
Collective.ALLTOALL = Collective.declare("alltoall")
Collective.REDUCESCATTER = Collective.declare("reducescatter")
Collective.BARRIER = Collective.declare("barrier")
Collective.BROADCAST_OBJECT = Collective.declare("broadcast_object")
Collective.ALLGATHER_OBJECT = Collective.declare("allgather_object")
Collective.JOIN = Collective.declare("join")


class Token(enum.Enum):
    """A rank's news for the coordinator, sent among its requests."""

    JOIN = "join"  # this rank has no more data (see collectives.join)
    SHUTDOWN = "shutdown"  # this rank's engine is stopping
    WAITING = "waiting"  # a caller on this rank now waits for a result
    NOT_WAITING = "not waiting"  # no caller on this rank waits any more
    # From rank 0, first in a list of batches it held a while: the ranks meet without spinning
    # before running them (see Engine._arrive_together_after_a_hold).
    ARRIVE_TOGETHER = "arrive together"


class Outcome(_TextEnum):
    """The kinds of batch that run no collective."""

    JOIN_DONE = "join_done"  # every rank has joined; value: the last one to join
    SHUTDOWN = "shutdown"  # value: the first rank that shut down
    STALLED = "stalled"  # value: the stall inspector's report
    TUNE = "tune"  # value: (fusion threshold bytes, cycle time ms, algorithm or None); see autotune


class GroupLayout(_TextEnum):
    """Where a grouped all-reduce's members are reduced (see groups.group_layout)."""

    MEMBERS = "members"  # each member where it lies, into its output
    PACKED = "packed"  # the members packed end to end into one buffer


def _label(text: str):
    return dataclasses.field(default=None, metadata={"label": text})


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The values every rank must share for one call; None where a collective has no such value.

    Compared field by field in this order, so a mismatch is reported as the first field that
    differs, by its label ("Mismatched shapes for 'x'"): a group's members come before the
    packed length they imply, and the mark of an Average applied while packing comes last.
    """

    root_rank: Optional[int] = _label("root ranks")
    member_dtypes: Optional[Tuple[str, ...]] = _label("member dtypes")
    member_shapes: Optional[Tuple[tuple, ...]] = _label("member shapes")
    in_place: Optional[bool] = _label("in place")
    dtype: Optional[str] = _label("dtypes")
    shape: Optional[tuple] = _label("shapes")
    trailing_shape: Optional[tuple] = _label("trailing dimensions")
    reduce_op: Optional[ReduceOp] = _label("reduce ops")
    prescale: Optional[float] = _label("prescale factors")
    postscale: Optional[float] = _label("postscale factors")
    layout: Optional[GroupLayout] = _label("group layouts")
    # Average's 1/size applied by every rank as it packed a group, so the sum is the average.
    averaged_while_packing: bool = dataclasses.field(default=False, metadata={"label": "averaged while packing"})


NOTHING_TO_AGREE = Agreement()
AGREEMENT_FIELDS = tuple((field.name, field.metadata["label"]) for field in dataclasses.fields(Agreement))


@dataclasses.dataclass(frozen=True)
class Request:
    """One rank's call.

    Args:
        kind: the collective.
        name: the tensor's name; ranks pair calls by it.
        agree: the values every rank must share.
        rows: allgather's first dimension on this rank (may differ per rank).
        splits: alltoall's rows for each receiving rank, from this rank.
        error: (exception type name, message) when this rank's own input was rejected.
    """

    kind: Collective
    name: str
    agree: Agreement = NOTHING_TO_AGREE
    rows: Optional[int] = None
    splits: Optional[Tuple[int, ...]] = None
    error: Optional[Tuple[str, str]] = None


@dataclasses.dataclass
class Batch:
    """Names every rank executes together, in list order.

    Args:
        kind: the collective, or the Outcome of a batch that runs none.
        names: tensor names (several only for a fused all-reduce).
        error: (class name, message) when the names failed the agreement check.
        requests: one agreed request per name, so a joined rank can contribute zeros.
        per_rank: for allgather, rows per rank; for alltoall, splits per sending rank.
        cache_ids: ids assigned to names in this batch, for the ranks' response caches.
        value: what an Outcome carries (see Outcome).
        known_ids: for an all-reduce whose names every rank sent as response-cache ids,
            those ids in order: the batch then travels to the workers as the ids alone
            (each engine rebuilds it from its own cache), which keeps pickling the agreed
            requests off every negotiation's critical path.
    """

    kind: Union[Collective, Outcome]
    names: List[str] = dataclasses.field(default_factory=list)
    error: Optional[Tuple[str, str]] = None
    requests: Optional[List[Request]] = None
    per_rank: Optional[list] = None
    cache_ids: Optional[Dict[str, int]] = None
    value: Any = None
    known_ids: Optional[List[int]] = None
