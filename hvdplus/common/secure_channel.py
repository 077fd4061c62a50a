"""An encrypted, authenticated session over a connection whose two ends proved the job's key to
each other (keyed_handshake): what the job channel of `hvdplus.run` and the pod agents speak.

After the handshake, each side derives two keys, one per direction, with HKDF-SHA256 from the
job's key, salted with both handshake nonces and bound to the service's role tags: a session's
keys are fresh even when a relay replays an old handshake, and a frame of one service or one
direction is worthless in another. Every frame is sealed with ChaCha20-Poly1305 (from the
`cryptography` package, a well-kept binding of OpenSSL: no cryptography is made here), its
nonce the frame's sequence number in its direction and its length header authenticated with it.
So a relay in the path reads nothing, and a frame it changes, replays, reorders or drops fails
the next `receive` at once; an explicit end frame (`finish`) makes a cut connection fail too.

Frames carry at most `FRAME_BYTES` of a message, and a frame's announced length is checked
against that before anything is allocated; a message's total is checked against the limit the
reader gives. A key holder cannot make the reader allocate more than it asked for, and a stranger
cannot get past the first frame.

    session = open_session(connection, key, ROLES, deadline)     # or accept_session on the server
    session.send(b"request")
    reply = session.receive(limit=1 << 20)
    session.finish()                                             # the peer's expect_end() sees it
"""

import struct
import time
from typing import Optional

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .keyed_handshake import HandshakeRoles, answer_handshake, open_handshake, receive_exactly

__all__ = ["FRAME_BYTES", "ChannelError", "SecureSession", "accept_session", "open_session", "handshake_deadline"]

FRAME_BYTES = 1 << 20
_HEADER = struct.Struct("!Ic")
_TAG_BYTES = 16
_KEY_BYTES = 32
# A frame's kind, in its header: more of this message follows, its last part, the session's end.
_MORE, _LAST, _END = b"M", b"L", b"E"


class ChannelError(ConnectionError):
    """A frame that failed its check, or a session that ended or grew past its limit."""


def handshake_deadline(seconds: float) -> float:
    """The time.monotonic() value `seconds` from now."""
    return time.monotonic() + seconds


class SecureSession:
    """Sealed frames over `connection`, once the keys are derived (`open_session`, `accept_session`).

    Args:
        connection: the connection, after its handshake.
        name: the channel's name, in every error.
        send_key: the key of frames this side sends.
        receive_key: the key of frames it receives.
    """

    def __init__(self, connection, name: str, send_key: bytes, receive_key: bytes):
        self.connection = connection
        self.name = name
        self._sealer = ChaCha20Poly1305(send_key)
        self._opener = ChaCha20Poly1305(receive_key)
        self._sent = 0
        self._received = 0
        self._ended = False

    def send(self, data) -> None:
        """Send `data` (bytes-like) as one message, in frames of at most FRAME_BYTES."""
        view = memoryview(data).cast("B")
        start = 0
        while True:
            chunk = view[start:start + FRAME_BYTES]
            start += len(chunk)
            self._send_frame(_LAST if start >= len(view) else _MORE, chunk)
            if start >= len(view):
                return

    def finish(self) -> None:
        """Send the end frame: the peer's `expect_end` then knows it was not cut short."""
        self._send_frame(_END, b"")

    def receive(self, limit: int) -> bytearray:
        """The next message, its every frame checked; ChannelError when a frame fails its check,
        the session ends, or the message grows past `limit` bytes."""
        message = bytearray()
        while True:
            kind, chunk = self._receive_frame()
            if kind == _END:
                raise ChannelError(f"{self.name}: the peer ended the session where a message was due")
            if len(message) + len(chunk) > limit:  # checked before the chunk is added
                raise ChannelError(f"{self.name}: the peer's message grew past its limit of {limit} bytes")
            message += chunk
            if kind == _LAST:
                return message

    def expect_end(self) -> None:
        """Check that the peer ended the session with its end frame; ChannelError otherwise."""
        kind, _ = self._receive_frame()
        if kind != _END:
            raise ChannelError(f"{self.name}: the peer sent more where the session's end was due")

    def _nonce(self, number: int) -> bytes:
        return number.to_bytes(12, "big")

    def _send_frame(self, kind: bytes, chunk) -> None:
        # The header (the sealed length and the kind) travels in clear and is authenticated as
        # the frame's associated data; the sequence number is the nonce.
        header = _HEADER.pack(len(chunk) + _TAG_BYTES, kind)
        sealed = self._sealer.encrypt(self._nonce(self._sent), chunk, header)
        self._sent += 1
        self.connection.sendall(header)
        self.connection.sendall(sealed)

    def _receive_frame(self):
        try:
            header = bytes(receive_exactly(self.connection, _HEADER.size))
        except ConnectionError:
            raise ChannelError(f"{self.name}: the connection was cut before the session's end") from None
        length, kind = _HEADER.unpack(header)
        # Checked before a byte is allocated: a frame is never longer than this.
        if not _TAG_BYTES <= length <= FRAME_BYTES + _TAG_BYTES:
            raise ChannelError(f"{self.name}: a frame announced {length} bytes, outside {_TAG_BYTES}.."
                               f"{FRAME_BYTES + _TAG_BYTES}")
        try:
            sealed = receive_exactly(self.connection, length)
        except ConnectionError:
            raise ChannelError(f"{self.name}: the connection was cut inside a frame") from None
        try:
            chunk = self._opener.decrypt(self._nonce(self._received), sealed, header)
        except InvalidTag:
            raise ChannelError(f"{self.name}: frame {self._received} failed its authentication: changed, "
                               "replayed, reordered or not from the key's holder") from None
        self._received += 1
        if kind not in (_MORE, _LAST, _END):
            raise ChannelError(f"{self.name}: frame {self._received - 1} is of no known kind")
        return kind, chunk


def _keys(key: bytes, nonces: bytes, roles: HandshakeRoles):
    """(the server's sending key, the client's sending key) for one session."""
    derived = HKDF(algorithm=hashes.SHA256(), length=2 * _KEY_BYTES, salt=nonces,
                   info=b"hvdplus secure channel\0" + roles.server + b"\0" + roles.client).derive(key)
    return derived[:_KEY_BYTES], derived[_KEY_BYTES:]


def open_session(connection, key: bytes, roles: HandshakeRoles, name: str, deadline: float) -> SecureSession:
    """The connecting side: the handshake (ConnectionError when the server does not hold `key`),
    then the session.

    Args:
        connection: a connection just made.
        key: the job's key.
        roles: the service's proof tags.
        name: the channel's name, in every error.
        deadline: a time.monotonic() value by which the handshake ends.
    """
    nonces = open_handshake(connection, key, roles, deadline)
    server_key, client_key = _keys(key, nonces, roles)
    return SecureSession(connection, name, send_key=client_key, receive_key=server_key)


def accept_session(connection, key: bytes, roles: HandshakeRoles, name: str,
                   deadline: float) -> Optional[SecureSession]:
    """The listening side, on a connection just accepted: the session, or None when the peer
    did not prove it holds `key`; its arguments are `open_session`'s."""
    nonces = answer_handshake(connection, key, roles, deadline)
    if nonces is None:
        return None
    server_key, client_key = _keys(key, nonces, roles)
    return SecureSession(connection, name, send_key=server_key, receive_key=client_key)
