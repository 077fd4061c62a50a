"""How `hvdplus.run` hands the function to call, and its arguments, to every rank: cloudpickled
bytes in base64, in environment variables that mpirun passes to every host
(HVDPLUS_RUN_PAYLOAD_0, _1, ...). Open MPI 5 does not pass a pipe on mpirun's standard input
to rank 0 (the rank never reads its end), and no file is shared with other hosts, so the
variables are the one way that reaches every rank. Linux takes up to 128 KiB in one variable
and a few MiB in all of them, so the payload has a limit: pass large data by a path or a URL
the ranks read, not as an argument.
"""

import base64
from typing import Dict, Mapping

__all__ = ["MAX_BYTES", "to_environment", "from_environment"]

_PREFIX = "HVDPLUS_RUN_PAYLOAD_"
_PIECE_CHARS = 96 * 1024
MAX_BYTES = 1 << 20


def to_environment(payload: bytes) -> Dict[str, str]:
    if len(payload) > MAX_BYTES:
        raise ValueError(f"the function and its arguments take {len(payload)} bytes pickled, more than the "
                         f"{MAX_BYTES} that reach the ranks: pass large data by a path the ranks read")
    encoded = base64.b64encode(payload).decode()
    pieces = [encoded[at:at + _PIECE_CHARS] for at in range(0, len(encoded), _PIECE_CHARS)] or [""]
    return {f"{_PREFIX}{index}": piece for index, piece in enumerate(pieces)}


def from_environment(environ: Mapping[str, str]) -> bytes:
    pieces = []
    while f"{_PREFIX}{len(pieces)}" in environ:
        pieces.append(environ[f"{_PREFIX}{len(pieces)}"])
    if not pieces:
        raise RuntimeError("hvdplus.run_rank runs the ranks of hvdplus.run, which passes it the function to "
                           "call; it found none")
    return base64.b64decode("".join(pieces))
