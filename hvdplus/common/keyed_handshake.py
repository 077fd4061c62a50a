"""Two processes that share a job's key prove it to each other over a fresh connection, before
either acts on a byte the other sends.

Each side sends a random challenge and answers the other's with an HMAC-SHA256 of it under the
key, tagged with its role, so that one side's answer can never be replayed as the other's. The
key itself never crosses the connection. Used by the channel between `hvdplus.run` and its ranks
(payload_channel) and by the pod agents that start mpirun's daemons on Kubernetes
(hvdplus.runner.pod_agent).

    # server                                          # client
    if answer_handshake(connection, key, ROLES):       open_handshake(connection, key, ROLES)
        ...                                            ...
"""

import collections
import dataclasses
import errno
import hashlib
import hmac
import logging
import secrets
import socket
import threading
import time
from typing import Callable, Optional

__all__ = ["HandshakeRoles", "answer_handshake", "open_handshake", "receive_exactly", "serve_connections",
           "stop_listening", "MAX_PENDING"]

_NONCE_BYTES = 32
_CHUNK_BYTES = 4 << 20
# The most connections a listener keeps in their handshake; past it, the oldest is cut.
MAX_PENDING = 64
_ACCEPT_RETRY_S = 0.05
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HandshakeRoles:
    """The tags of the two sides' proofs: distinct per service, so that a proof made for one
    service proves nothing to another that shares the key.

    Args:
        server: the listening side's tag.
        client: the connecting side's tag.
    """

    server: bytes
    client: bytes


def _proof(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def receive_exactly(connection: socket.socket, count: int, deadline: Optional[float] = None) -> bytearray:
    """`count` bytes from `connection`; ConnectionError when it ends first, TimeoutError when
    `deadline` (a time.monotonic() value) passes first, however slowly the peer trickles them."""
    data = bytearray(count)
    view = memoryview(data)
    got = 0
    while got < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the peer sent {got} of {count} bytes before its deadline")
            connection.settimeout(left)
        received = connection.recv_into(view[got:], min(count - got, _CHUNK_BYTES))
        if not received:
            raise ConnectionError(f"the connection ended after {got} of {count} bytes")
        got += received
    return data


def answer_handshake(connection: socket.socket, key: bytes, roles: HandshakeRoles,
                     deadline: Optional[float] = None) -> Optional[bytes]:
    """The listening side: when the peer proved it holds `key` (after proving it to the peer),
    both nonces (the client's, then the server's), from which the session's keys derive; None
    when it did not.

    Args:
        connection: a connection just accepted, with a timeout set.
        key: the job's key.
        roles: the service's proof tags.
        deadline: a time.monotonic() value by which the whole handshake ends.
    """
    their_nonce = receive_exactly(connection, _NONCE_BYTES, deadline)
    our_nonce = secrets.token_bytes(_NONCE_BYTES)
    connection.sendall(our_nonce + _proof(key, roles.server, their_nonce))
    proof = receive_exactly(connection, hashlib.sha256().digest_size, deadline)
    if not hmac.compare_digest(proof, _proof(key, roles.client, our_nonce)):
        return None
    return bytes(their_nonce) + our_nonce


def open_handshake(connection: socket.socket, key: bytes, roles: HandshakeRoles,
                   deadline: Optional[float] = None) -> bytes:
    """The connecting side: check the server's proof of `key`, then give ours; both nonces (ours,
    then the server's); ConnectionError when the server does not hold the key.

    Args:
        connection: a connection just made, with a timeout set.
        key: the job's key.
        roles: the service's proof tags.
        deadline: a time.monotonic() value by which the whole handshake ends.
    """
    our_nonce = secrets.token_bytes(_NONCE_BYTES)
    connection.sendall(our_nonce)
    their_nonce = receive_exactly(connection, _NONCE_BYTES, deadline)
    proof = receive_exactly(connection, hashlib.sha256().digest_size, deadline)
    if not hmac.compare_digest(proof, _proof(key, roles.server, our_nonce)):
        raise ConnectionError("the server there does not hold this job's key")
    connection.sendall(_proof(key, roles.client, their_nonce))
    return our_nonce + bytes(their_nonce)


def serve_connections(listener: socket.socket, handle: Callable[[socket.socket, Callable[[], None]], None],
                      thread_name: str, max_pending: int = MAX_PENDING) -> None:
    """Hand each connection `listener` accepts to `handle`, in a thread of its own, until
    `stop_listening` closes it.

    A stranger cannot stop the listener: past `max_pending` connections whose handshake has not
    ended, the oldest is cut (its handshake then fails at once), and an error of accept() other
    than the listener's own close (too many open files, say) is logged once and the loop goes on.

    Args:
        listener: a listening socket.
        handle: takes one accepted connection (and closes it) and a callable it calls once the
            handshake has ended, either way.
        thread_name: the name of each connection's thread.
        max_pending: the most connections still in their handshake.
    """
    pending: "collections.OrderedDict[int, socket.socket]" = collections.OrderedDict()
    lock = threading.Lock()
    logged = set()
    while True:
        try:
            connection, _ = listener.accept()
        except OSError as error:
            if listener.fileno() == -1 or error.errno in (errno.EBADF, errno.EINVAL):
                return  # closed
            if error.errno not in logged:
                logged.add(error.errno)
                _log.warning("%s: accept() failed, still listening: %s", thread_name, error)
            time.sleep(_ACCEPT_RETRY_S)
            continue
        with lock:
            pending[id(connection)] = connection
            while len(pending) > max_pending:
                _, oldest = pending.popitem(last=False)
                _cut(oldest)

        def proved(connection=connection) -> None:
            with lock:
                pending.pop(id(connection), None)

        threading.Thread(target=handle, args=(connection, proved), name=thread_name, daemon=True).start()


def _cut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def stop_listening(listener: socket.socket) -> None:
    """Close `listener`, waking a `serve_connections` blocked in accept."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
