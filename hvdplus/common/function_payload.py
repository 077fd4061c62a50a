"""How `hvdplus.run` hands the function to call, and its arguments, to every rank, when they
are small: cloudpickled bytes in base64, in environment variables that mpirun passes to every
host (HVDPLUS_RUN_PAYLOAD_0, _1, ...), with no port and no shared file. Linux takes at most
128 KiB in one variable and a few MiB in all of a process's, so anything over
ENVIRONMENT_BYTES (a data set passed as an argument) goes through the job's channel instead
(payload_channel).
"""

import base64
from typing import Dict, Mapping

__all__ = ["ENVIRONMENT_BYTES", "to_environment", "in_environment", "from_environment"]

_PREFIX = "HVDPLUS_RUN_PAYLOAD_"
_PIECE_CHARS = 96 * 1024
# Kept well under what an environment holds: every process of the job carries it.
ENVIRONMENT_BYTES = 256 * 1024


def to_environment(payload: bytes) -> Dict[str, str]:
    if len(payload) > ENVIRONMENT_BYTES:
        raise ValueError(f"{len(payload)} bytes are more than the {ENVIRONMENT_BYTES} that the ranks' "
                         "environment carries: serve them through the job's channel (payload_channel)")
    encoded = base64.b64encode(payload).decode()
    pieces = [encoded[at:at + _PIECE_CHARS] for at in range(0, len(encoded), _PIECE_CHARS)] or [""]
    return {f"{_PREFIX}{index}": piece for index, piece in enumerate(pieces)}


def in_environment(environ: Mapping[str, str]) -> bool:
    """Whether `environ` holds the payload itself (else the job's channel serves it)."""
    return f"{_PREFIX}0" in environ


def from_environment(environ: Mapping[str, str]) -> bytes:
    pieces = []
    while f"{_PREFIX}{len(pieces)}" in environ:
        pieces.append(environ[f"{_PREFIX}{len(pieces)}"])
    if not pieces:
        raise RuntimeError("hvdplus.run_rank runs the ranks of hvdplus.run, which passes it the function to "
                           "call; it found none")
    return base64.b64decode("".join(pieces))
