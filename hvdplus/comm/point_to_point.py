"""The wire protocol of point-to-point messages, on an explicit communicator: each message is
a header (dtype, shape, tag), the data, and an acknowledgement that carries OK or the
receiver's mismatch error, so both ranks raise the same error (hvdplus.core.p2p is the API).

A `Link` holds one communicator's messages in flight; `Send` and `Recv` are the operations,
each a few nonblocking MPI steps that `Link.progress` moves on whenever a caller waits or
polls.

Wire tags: bits 0-1 say what a message is. Headers carry the caller's tag and channel (bit 2:
the gradient channel); data and acknowledgements carry the sender's sequence number for that
destination, so each belongs to exactly one header whatever order the messages are waited for in.
"""

import json
import threading
from typing import Callable

import numpy as np

from ..common.dtypes import dtype_name
from ..common.errors import HvdplusError, RanksFailedError

__all__ = ["Link", "Operation", "Send", "Recv", "tag_text"]

# Headers and acknowledgements are JSON of at most this many bytes: a header describes a
# shape of at most 64 dimensions, an acknowledgement carries an error naming two of them.
_MESSAGE_BYTES = 8192
_HEADER, _DATA, _ACK = 0, 1, 2


class Link:
    """The point-to-point state of one communicator: the next sequence number for each
    destination and the operations in flight.

    Args:
        comm: the communicator the messages travel on, of this link alone.
        on_process_failure: called when a peer's death fails a message, before every message
            in flight fails with RanksFailedError (to revoke the job's other communicators).
    """

    def __init__(self, comm, on_process_failure: Callable[[], None]):
        from mpi4py import MPI

        self.comm = comm
        self.on_process_failure = on_process_failure
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        upper = self.comm.Get_attr(MPI.TAG_UB)
        self.tag_limit = (upper + 1) // 8  # tag * 8 + gradient * 4 + _HEADER <= upper
        self.sequence_limit = (upper + 1) // 4
        self.next_sequence = {}
        self.pending = []
        self.lock = threading.Lock()

    def take_sequence(self, dst: int) -> int:
        sequence = self.next_sequence.get(dst, 0)
        self.next_sequence[dst] = (sequence + 1) % self.sequence_limit
        return sequence

    def progress(self) -> None:
        """Test every operation in flight once, moving each on as far as it can go."""
        from mpi4py import MPI

        with self.lock:
            for operation in list(self.pending):
                if operation.done:  # failed along with another one
                    continue
                try:
                    operation.advance()
                except MPI.Exception as exc:
                    self.fail(operation, exc)
            self.pending = [operation for operation in self.pending if not operation.done]

    def start(self, operation: "Operation") -> None:
        from mpi4py import MPI

        with self.lock:
            try:
                operation.begin()
            except MPI.Exception as exc:
                self.pending.append(operation)
                self.fail(operation, exc)
                self.pending = [operation for operation in self.pending if not operation.done]
            else:
                self.pending.append(operation)

    def fail(self, operation: "Operation", exc) -> None:
        """An MPI error in `operation`. A dead peer (or a communicator revoked because one
        died) fails every message in flight, as the communicators are then revoked."""
        from .failures import failed_ranks, is_process_failure  # imports mpi4py.MPI, which starts MPI


        if not is_process_failure(exc):
            operation.finish(error=HvdplusError(f"{operation.what}: MPI failed: {exc}"))
            return
        failed = failed_ranks(self.comm)
        self.on_process_failure()
        for pending in self.pending:
            if not pending.done:
                pending.finish(error=RanksFailedError.seen_on(self.rank, self.size, failed, pending.what))


def tag_text(tag: int, gradient: bool) -> str:
    return f"tag {tag}" + (" (gradient)" if gradient else "")


def _description(dtype: str, shape) -> str:
    return f"{dtype} of shape {tuple(shape)}"


class Operation:
    """One message in flight on this rank: the MPI requests of its current step."""

    def __init__(self, link: Link, peer: int, tag: int, gradient: bool, what: str):
        self.link = link
        self.peer = peer
        self.tag = tag
        self.gradient = gradient
        self.what = what
        self.requests = []
        self.done = False
        self.error = None
        self.result = None
        self.steps_taken = 0  # a waiter that sees it grow knows the peer is there

    @property
    def header_tag(self) -> int:
        return self.tag * 8 + (4 if self.gradient else 0) + _HEADER

    def advance(self) -> None:
        """Test the current step's requests; while a step completes, take the next one."""
        while not self.done:
            self.requests = [request for request in self.requests if not request.Test()]
            if self.requests:
                return
            self.steps_taken += 1
            self.step()

    def finish(self, result=None, error=None) -> None:
        self.result, self.error, self.done = result, error, True
        self.requests = []

    def begin(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError


def _encode(message: dict) -> bytes:
    data = json.dumps(message).encode()
    if len(data) > _MESSAGE_BYTES:
        raise ValueError(f"point-to-point control message of {len(data)} bytes is too long")
    return data


def _decode(buffer: bytearray) -> dict:
    return json.loads(bytes(buffer).rstrip(b"\0"))


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """A uint8 view over a C-contiguous array's memory (MPI moves bytes; bfloat16 and
    bool have no MPI type of their own)."""
    return array.reshape(-1).view(np.uint8)


class Send(Operation):
    def __init__(self, link, dst, tag, gradient, array: np.ndarray):
        super().__init__(link, dst, tag, gradient, f"send to rank {dst} with {tag_text(tag, gradient)}")
        self.array = array
        self.header = None
        self.ack = bytearray(_MESSAGE_BYTES)

    def begin(self) -> None:
        from mpi4py import MPI

        comm, dst = self.link.comm, self.peer
        sequence = self.link.take_sequence(dst)
        self.header = _encode({"dtype": dtype_name(self.array.dtype), "shape": list(self.array.shape),
                               "nbytes": self.array.nbytes, "tag": self.tag, "sequence": sequence})
        self.requests = [
            comm.Isend([self.header, MPI.BYTE], dest=dst, tag=self.header_tag),
            comm.Isend([_bytes_of(self.array), MPI.BYTE], dest=dst, tag=sequence * 4 + _DATA),
            comm.Irecv([self.ack, MPI.BYTE], source=dst, tag=sequence * 4 + _ACK),
        ]

    def step(self) -> None:
        answer = _decode(self.ack)
        self.array = None
        if answer.get("ok"):
            self.finish()
        else:
            self.finish(error=ValueError(answer["error"]))


class Recv(Operation):
    def __init__(self, link, src, tag, gradient, array: np.ndarray):
        super().__init__(link, src, tag, gradient, f"recv from rank {src} with {tag_text(tag, gradient)}")
        self.array = array
        self.header = bytearray(_MESSAGE_BYTES)
        self.sequence = None
        self.mismatch = None
        self.acknowledged = False
        self.outgoing = None

    def begin(self) -> None:
        from mpi4py import MPI

        self.requests = [self.link.comm.Irecv([self.header, MPI.BYTE], source=self.peer, tag=self.header_tag)]

    def step(self) -> None:
        from mpi4py import MPI

        comm = self.link.comm
        if self.sequence is None:  # the header is in: take the data, or drain it on a mismatch
            header = _decode(self.header)
            self.sequence = header["sequence"]
            into = self._check(header)
            self.requests = [comm.Irecv([into, MPI.BYTE], source=self.peer, tag=self.sequence * 4 + _DATA)]
        elif not self.acknowledged:
            self.acknowledged = True
            answer = {"ok": True} if self.mismatch is None else {"ok": False, "error": self.mismatch}
            self.outgoing = _encode(answer)  # held until the send completes
            self.requests = [comm.Isend([self.outgoing, MPI.BYTE], dest=self.peer, tag=self.sequence * 4 + _ACK)]
        elif self.mismatch is None:
            self.finish(result=self.array)
        else:
            self.finish(error=ValueError(self.mismatch))

    def _check(self, header: dict):
        """Where the data goes: the array, or a scratch buffer when the header does not
        match it (the message must still be received, so that the sender's completes)."""
        expected = (dtype_name(self.array.dtype), list(self.array.shape))
        if (header["dtype"], header["shape"]) == expected:
            return _bytes_of(self.array)
        me, src = self.link.rank, self.peer
        self.mismatch = (
            f"point-to-point message from rank {src} to rank {me} with {tag_text(self.tag, self.gradient)} "
            f"does not match: rank {src} sent {_description(header['dtype'], header['shape'])}, rank {me} expected "
            f"{_description(*expected)}")
        return bytearray(header["nbytes"])
