"""The check that every rank asked for the same thing.

Each rank describes its call as a `Request` (see protocol); the requests of all ranks are
compared before any data moves, so a mismatch becomes an error on every rank instead of a
hang or a silent mix-up.
"""

from typing import Any, Dict, Optional, Sequence

from ..common.errors import TensorMismatchError, input_error_class
from .protocol import AGREEMENT_FIELDS, Collective, Request

__all__ = ["input_error", "check_agreement", "describe_by_rank"]


def input_error(kind: Collective, name: str, exc: Exception) -> Request:
    """The request a rank sends when its own arguments were rejected with `exc`."""
    return Request(kind, name, error=(type(exc).__name__, str(exc)))


def describe_by_rank(values: Sequence[Any], ranks: Optional[Sequence[int]] = None) -> str:
    """'rank 0 had (2, 3), ranks 1, 2 had (4,)': ranks grouped by the value they had.

    `ranks[i]` is the rank that had `values[i]` (default: i)."""
    groups: Dict[str, list] = {}
    for rank, value in zip(ranks if ranks is not None else range(len(values)), values):
        groups.setdefault(_show(value), []).append(rank)
    parts = []
    for shown, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        parts.append(f"{who} had {shown}")
    return ", ".join(parts)


def _show(value: Any) -> str:
    if hasattr(value, "label"):
        return value.label
    return str(value)


def check_agreement(requests: Sequence[Request], ranks: Optional[Sequence[int]] = None) -> None:
    """Raise the same exception on every rank unless all `requests` agree.

    `ranks[i]` is the rank that sent `requests[i]` (default: i)."""
    ranks = list(ranks) if ranks is not None else list(range(len(requests)))
    failed = [(rank, request.error) for rank, request in zip(ranks, requests) if request.error]
    if failed:
        first_type = failed[0][1][0]
        detail = "; ".join(f"rank {rank}: {message}" for rank, (_, message) in failed)
        raise input_error_class(first_type)(detail)

    calls = [f"{request.kind} '{request.name}'" for request in requests]
    if len(set(calls)) > 1:
        raise TensorMismatchError(
            f"Mismatched collectives: {describe_by_rank(calls, ranks)}; every rank must call the "
            "same collectives in the same order (or give them the same names)"
        )

    reference = requests[0]
    if all(request.agree == reference.agree for request in requests[1:]):
        return
    for field, label in AGREEMENT_FIELDS:
        values = [getattr(request.agree, field) for request in requests]
        if any(value != values[0] for value in values[1:]):
            raise TensorMismatchError(
                f"Mismatched {label} for '{reference.name}' ({reference.kind}): "
                f"{describe_by_rank(values, ranks)}"
            )
