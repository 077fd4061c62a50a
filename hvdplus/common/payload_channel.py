"""Large payloads between the process that started a job and its ranks, both ways, over a
port that answers only the job's own ranks.

`hvdplus.run` hands every rank the function to call and its arguments, and gets back what each
rank returned. Small ones ride in environment variables and in lines of the ranks' output
(function_payload, hvdplus.run_rank). Large ones (a data set passed as an argument, a model's
weights returned) go through the job's `JobChannel`, a server in the launching process for as
long as the job runs: rank 0 of each launch fetches the payload and broadcasts it to the others
over MPI, so it crosses the network once, and a rank posts a large result there, then names it
in a line of its output. Open MPI 5's mpirun does not hand a pipe on its standard input to rank
0, drops the end of a remote rank's output that is large when the job ends, and no file is
shared with other hosts: a port is the channel left that reaches every rank wherever it runs.

The port is guarded by a key of the job's (256 random bits, which reach the ranks in their
environment through mpirun, never on a command line): each side proves it holds the key by an
HMAC-SHA256 of a challenge the other side chose, before a byte of a payload moves, and the
served payload's SHA-256 digest, which travels beside the key, is checked on arrival. The
server listens on the loopback interface when every rank runs on this machine, on every
interface otherwise, and closes when the job ends.

    with JobChannel(payload, local_only=True) as channel:
        env = channel.env             # for the ranks' environment
        ...                           # rank 0 calls fetch(os.environ); a rank post(os.environ, data)
        data = channel.taken(token)   # what a rank posted, by the token it named
"""

import hashlib
import secrets
import socket
import struct
import threading
from typing import Callable, Dict, List, Mapping, Optional, Sequence, TypeVar

from .keyed_handshake import HandshakeRoles, serve_connections, stop_listening
from .secure_channel import SecureSession, accept_session, handshake_deadline, open_session

__all__ = ["JobChannel", "fetch", "post", "has_channel", "local_addresses", "reaching_addresses", "MAX_POST_BYTES"]

ADDRESSES_ENV = "HVDPLUS_RUN_CHANNEL"
KEY_ENV = "HVDPLUS_RUN_CHANNEL_KEY"
DIGEST_ENV = "HVDPLUS_RUN_PAYLOAD_SHA256"
SIZE_ENV = "HVDPLUS_RUN_PAYLOAD_BYTES"

_ROLES = HandshakeRoles(server=b"hvdplus payload server", client=b"hvdplus payload client")
_NAME = "the job channel of hvdplus.run"
_FETCH, _POST, _POSTED = b"F", b"P", b"K"
_TOKEN_BYTES = 16
# The most a rank may post: a stated cap, since the launcher cannot know a result's size ahead.
MAX_POST_BYTES = 64 << 30
# A peer that has not ended its handshake within this long is dropped, however it trickles; an
# address that does not answer within the connect timeout is passed over for the next one.
_HANDSHAKE_SECONDS = 5.0
# How long the channel waits for each frame of a proved peer before it drops the connection.
_QUIET_PEER_SECONDS = 60.0
_CONNECT_SECONDS = 5.0
_SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address
T = TypeVar("T")


def reaching_addresses(hosts: Sequence[str]) -> List[str]:
    """This machine's IPv4 addresses by which it reaches `hosts` (the route's source address to
    each; none for a host that does not resolve or is this machine's loopback), in the order
    of the hosts; every non-loopback address of this machine when none is found that way."""
    found = []
    for host in hosts:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((socket.gethostbyname(host), 9))  # a route lookup; nothing is sent
                found.append(probe.getsockname()[0])
        except OSError:
            continue
    found = [address for address in found if not address.startswith("127.")]
    if not found:
        found = [address for address in local_addresses() if not address.startswith("127.")]
    return list(dict.fromkeys(found)) or ["127.0.0.1"]


def local_addresses() -> List[str]:
    """This machine's IPv4 addresses, loopback first: the ones a rank may reach the server at."""
    found = ["127.0.0.1"]
    try:
        import fcntl  # Linux and the other Unixes; elsewhere the host name's addresses below
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with probe:
            for _, name in socket.if_nameindex():
                try:
                    reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
                except OSError:
                    continue  # an interface without an IPv4 address
                found.append(socket.inet_ntoa(reply[20:24]))
    except (ImportError, OSError):
        pass
    try:
        found += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return list(dict.fromkeys(found))


class JobChannel:
    """Serves `payload` (None: nothing to fetch) to whoever proves it holds the job's key, and
    keeps what such a peer posts, until closed.

    Args:
        payload: the bytes rank 0 fetches, or None when they reach the ranks otherwise.
        local_only: every rank runs on this machine: listen on the loopback interface only.
        hosts: the job's hosts, when not local_only: listen on the addresses that reach them.
    """

    def __init__(self, payload: Optional[bytes], local_only: bool, hosts: Sequence[str] = ()):
        self._payload = payload
        self._key = secrets.token_bytes(32)
        self._posted: Dict[bytes, bytearray] = {}
        self._lock = threading.Lock()
        addresses = ["127.0.0.1"] if local_only else reaching_addresses(hosts)
        self._sockets = [socket.create_server((addresses[0], 0), backlog=64)]
        port = self._sockets[0].getsockname()[1]
        for address in addresses[1:]:
            self._sockets.append(socket.create_server((address, port), backlog=64))
        self.env: Dict[str, str] = {
            ADDRESSES_ENV: ",".join(f"{address}:{port}" for address in addresses), KEY_ENV: self._key.hex(),
        }
        if payload is not None:
            self.env.update({DIGEST_ENV: hashlib.sha256(payload).hexdigest(), SIZE_ENV: str(len(payload))})
        self._threads = [threading.Thread(target=serve_connections, args=(listener, self._answer,
                         "hvdplus-job-channel-peer"), name="hvdplus-job-channel", daemon=True)
                         for listener in self._sockets]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> "JobChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening; a transfer under way goes on to its end."""
        for listener in self._sockets:
            stop_listening(listener)
        for thread in self._threads:
            thread.join(timeout=5)

    def taken(self, token: str) -> bytearray:
        """What a rank posted under `token` (KeyError: nothing), given once."""
        with self._lock:
            return self._posted.pop(bytes.fromhex(token))

    def _answer(self, connection: socket.socket, proved: Callable[[], None]) -> None:
        with connection:
            try:
                try:
                    session = accept_session(connection, self._key, _ROLES, _NAME,
                                             handshake_deadline(_HANDSHAKE_SECONDS))
                finally:
                    proved()
                if session is None:
                    return  # not one of the job's ranks: it gets nothing
                # A key holder that goes quiet after its handshake gives its thread back.
                connection.settimeout(_QUIET_PEER_SECONDS)
                request = session.receive(limit=1 + _TOKEN_BYTES)
                if request == _FETCH and self._payload is not None:
                    session.send(self._payload)
                elif request[:1] == _POST and len(request) == 1 + _TOKEN_BYTES:
                    # Kept only once every frame authenticated and the rank ended its session.
                    data = session.receive(limit=MAX_POST_BYTES)
                    session.expect_end()
                    with self._lock:
                        self._posted[bytes(request[1:])] = data
                    session.send(_POSTED)
                session.finish()
            except OSError:
                return  # the peer went away or failed a check; a rank that did reports it itself


def has_channel(environ: Mapping[str, str]) -> bool:
    """Whether `environ` names a job's channel."""
    return ADDRESSES_ENV in environ


def _connected(address: str, key: bytes) -> SecureSession:
    """A session with the channel at `address`, each side's proof of the key given."""
    host, port = address.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=_CONNECT_SECONDS)
    try:
        session = open_session(connection, key, _ROLES, _NAME, handshake_deadline(_HANDSHAKE_SECONDS))
        connection.settimeout(None)
        return session
    except BaseException:
        connection.close()
        raise


def _exchange(environ: Mapping[str, str], talk: Callable[[SecureSession], T]) -> T:
    """`talk` over a connection to the channel that `environ` names, at the first of its
    addresses that answers (the launcher's machine may be this one, or reached on one of its
    networks)."""
    key = bytes.fromhex(environ[KEY_ENV])
    failures = []
    for address in environ[ADDRESSES_ENV].split(","):
        try:
            connection = _connected(address, key)
        except (OSError, ValueError) as error:
            failures.append(f"{address}: {error}")
            continue
        with connection.connection:
            return talk(connection)
    raise ConnectionError(f"no address of the process that started the job answered ({'; '.join(failures)})")


def fetch(environ: Mapping[str, str]) -> bytearray:
    """The payload served to the job, its digest checked."""

    size = int(environ[SIZE_ENV])

    def fetch_payload(session: SecureSession) -> bytearray:
        session.send(_FETCH)
        payload = session.receive(limit=size)
        session.expect_end()
        return payload

    payload = _exchange(environ, fetch_payload)
    if len(payload) != int(environ[SIZE_ENV]) or hashlib.sha256(payload).hexdigest() != environ[DIGEST_ENV]:
        raise ConnectionError("the function and its arguments arrived damaged: their SHA-256 digest differs")
    return payload


def post(environ: Mapping[str, str], data: bytes) -> str:
    """Hand `data` to the process that started the job; the token that names it there (`taken`)."""
    token = secrets.token_bytes(_TOKEN_BYTES)

    if len(data) > MAX_POST_BYTES:
        raise ValueError(f"{len(data)} bytes are more than {_NAME} takes ({MAX_POST_BYTES})")

    def post_data(session: SecureSession) -> None:
        session.send(_POST + token)
        session.send(data)
        session.finish()
        if session.receive(limit=1) != _POSTED:
            raise ConnectionError("the process that started the job did not take the data")
        session.expect_end()

    _exchange(environ, post_data)
    return token.hex()
