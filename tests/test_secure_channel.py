"""The secure channel that the job channel and the pod agents speak (hvdplus.common.secure_channel),
against a real relay on loopback that holds no key: a TCP proxy thread that passes the handshake
through and then reads, changes, replays, reorders or cuts frames."""

import io
import json
import os
import secrets
import socket
import struct
import threading
import time

import pytest

from hvdplus.common import payload_channel
from hvdplus.common.keyed_handshake import HandshakeRoles
from hvdplus.common.secure_channel import ChannelError, FRAME_BYTES, accept_session, handshake_deadline, open_session
from hvdplus.runner import pod_agent, pod_connect

ROLES = HandshakeRoles(server=b"test server", client=b"test client")
KEY = secrets.token_bytes(32)
SECRET = b"the-secret-in-the-arguments-" + secrets.token_hex(8).encode()
# The handshake's bytes: the client's nonce, then the server's nonce and proof, then the client's proof.
HANDSHAKE_TO_SERVER, HANDSHAKE_TO_CLIENT = 32 + 32, 32 + 32
HEADER = struct.Struct("!Ic")  # a frame's sealed length and its kind


class Relay:
    """A TCP proxy to `upstream` on loopback, holding no key: it records what passes and hands
    each direction's bytes past the handshake to `to_server` / `to_client` (bytes -> bytes)."""

    def __init__(self, upstream, to_server=None, to_client=None):
        self.upstream = upstream
        self.seen = bytearray()
        self.tamper = {"server": to_server, "client": to_client}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for pumped in ((client, server, "server", HANDSHAKE_TO_SERVER),
                           (server, client, "client", HANDSHAKE_TO_CLIENT)):
                threading.Thread(target=self._pump, args=pumped, daemon=True).start()

    def _pump(self, source, sink, towards, handshake_bytes):
        passed = 0
        try:
            while data := source.recv(1 << 16):
                self.seen += data
                tamper = self.tamper[towards]
                if tamper is not None and passed + len(data) > handshake_bytes:
                    keep = max(0, handshake_bytes - passed)
                    data = data[:keep] + tamper(data[keep:])
                passed += len(data)
                sink.sendall(data)
        except OSError:
            pass
        for end in (sink, source):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()


def flip_first(data):
    """Flip one bit of the first sealed byte that passes (past the 4-byte length header)."""
    if len(data) <= HEADER.size:
        return data
    changed = bytearray(data)
    changed[HEADER.size] ^= 1
    return bytes(changed)


def flip_at(offset):
    """A tamper that flips one bit of the byte at `offset` past the handshake, however the
    stream is cut into reads."""
    passed = [0]

    def flip(data):
        changed = bytearray(data)
        if passed[0] <= offset < passed[0] + len(data):
            changed[offset - passed[0]] ^= 1
        passed[0] += len(data)
        return bytes(changed)

    return flip


def environ_through(channel, relay):
    return dict(channel.env, **{payload_channel.ADDRESSES_ENV: relay.address})


def test_a_relay_reads_nothing_of_a_fetched_payload():
    payload = SECRET * 1000
    with payload_channel.JobChannel(payload, local_only=True) as channel:
        address = channel.env[payload_channel.ADDRESSES_ENV]
        host, port = address.rsplit(":", 1)
        relay = Relay((host, int(port)))
        assert payload_channel.fetch(environ_through(channel, relay)) == payload
        relay.close()
    assert len(relay.seen) > len(payload)
    assert SECRET[:16] not in relay.seen


@pytest.mark.parametrize("towards", ["server", "client"])
def test_a_frame_a_relay_changes_fails_at_once_naming_the_channel(towards):
    payload = SECRET * 10
    with payload_channel.JobChannel(payload, local_only=True) as channel:
        host, port = channel.env[payload_channel.ADDRESSES_ENV].rsplit(":", 1)
        relay = Relay((host, int(port)), **{f"to_{towards}": flip_first})
        with pytest.raises(ConnectionError, match="job channel of hvdplus.run"):
            payload_channel.fetch(environ_through(channel, relay))
        relay.close()


def test_a_result_a_relay_changes_is_never_kept():
    with payload_channel.JobChannel(None, local_only=True) as channel:
        host, port = channel.env[payload_channel.ADDRESSES_ENV].rsplit(":", 1)
        # The request's frame: a header, P and a 16-byte token, and the tag; then the result's.
        request_frame = HEADER.size + 1 + 16 + 16
        change_the_result = flip_at(request_frame + HEADER.size + 5)
        relay = Relay((host, int(port)), to_server=change_the_result)
        with pytest.raises(ConnectionError):
            payload_channel.post(environ_through(channel, relay), SECRET * 100)
        relay.close()
        assert channel._posted == {}  # nothing kept, so nothing for the caller to unpickle
        token = payload_channel.post(channel.env, b"the real result")  # and the channel goes on serving
        assert channel.taken(token) == b"the real result"


def test_a_relay_cannot_change_the_agents_command(tmp_path):
    key = secrets.token_hex(32).encode()
    agent = pod_agent.PodAgent(key, 0)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    relay = Relay(("127.0.0.1", agent.port), to_server=flip_first)
    marker = tmp_path / "ran"
    try:
        with pod_connect.connect("127.0.0.1", relay.port, timeout=5) as connection:
            with pytest.raises(ConnectionError):
                pod_connect.run_remote(connection, key, f"touch {marker}", io.BytesIO())
        time.sleep(0.3)
        assert not marker.exists()
        quiet = Relay(("127.0.0.1", agent.port))
        output = io.BytesIO()
        with pod_connect.connect("127.0.0.1", quiet.port, timeout=5) as connection:
            assert pod_connect.run_remote(connection, key, f"echo {SECRET.decode()}", output) == 0
        assert output.getvalue() == SECRET + b"\n"
        assert SECRET not in quiet.seen  # neither the command nor its output in clear
        quiet.close()
    finally:
        relay.close()
        agent.close()


def session_pair():
    """A client and a server session over a real socket pair."""
    client_end, server_end = socket.socketpair()
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(
        accept_session(server_end, KEY, ROLES, "the test channel", handshake_deadline(10))))
    thread.start()
    client = open_session(client_end, KEY, ROLES, "the test channel", handshake_deadline(10))
    thread.join(10)
    client_end.settimeout(10)
    server_end.settimeout(10)
    return client, accepted[0]


def raw_frames(session, count):
    """The next `count` sealed frames on `session`'s socket, as they crossed the wire."""
    frames = []
    for _ in range(count):
        header = session.connection.recv(HEADER.size, socket.MSG_WAITALL)
        length, _ = HEADER.unpack(header)
        frames.append(header + session.connection.recv(length, socket.MSG_WAITALL))
    return frames


def receive_these(session, frames):
    """Have `session` read `frames` as if they came from its peer."""
    writer, reader = socket.socketpair()
    writer.sendall(b"".join(frames))
    writer.shutdown(socket.SHUT_WR)
    reader.settimeout(10)
    session.connection = reader


def test_frames_arrive_whole_and_in_order():
    client, server = session_pair()
    big = os.urandom(2 * FRAME_BYTES + 5)
    sender = threading.Thread(target=lambda: (client.send(b"first"), client.send(big), client.finish()))
    sender.start()
    assert server.receive(limit=5) == b"first"
    assert server.receive(limit=len(big)) == big
    server.expect_end()
    sender.join(10)


@pytest.mark.parametrize("order, error", [
    ([0, 0], "frame 1 failed its authentication"),       # replayed
    ([1, 0], "frame 0 failed its authentication"),       # reordered
    ([0], "cut before the session's end"),               # truncated: no end frame
])
def test_replayed_reordered_and_truncated_frames_fail(order, error):
    client, server = session_pair()
    client.send(b"one")
    client.send(b"two")
    frames = raw_frames(server, 2)
    receive_these(server, [frames[index] for index in order])
    with pytest.raises(ChannelError, match=error):
        server.receive(limit=3)
        server.receive(limit=3)
        server.expect_end()


def test_a_frame_announcing_more_than_a_frame_holds_fails_before_allocation():
    _, server = session_pair()
    receive_these(server, [HEADER.pack(0xFFFFFFFF, b"L")])
    with pytest.raises(ChannelError, match="announced 4294967295 bytes"):
        server.receive(limit=1 << 40)


def test_a_message_past_the_readers_limit_fails():
    client, server = session_pair()
    client.send(b"x" * 100)
    with pytest.raises(ChannelError, match="past its limit of 10 bytes"):
        server.receive(limit=10)


def test_a_frame_of_one_session_fails_in_another():
    client, server = session_pair()
    other_client, other_server = session_pair()
    client.send(b"for the first session")
    receive_these(other_server, raw_frames(server, 1))
    with pytest.raises(ChannelError, match="failed its authentication"):
        other_server.receive(limit=100)


def resident_bytes():
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_idle_and_trickling_peers_do_not_stop_a_real_fetch():
    payload = SECRET * 100
    with payload_channel.JobChannel(payload, local_only=True) as channel:
        host, port = channel.env[payload_channel.ADDRESSES_ENV].rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(200)]
        trickler = socket.create_connection((host, int(port)))
        stop = threading.Event()

        def trickle():
            while not stop.wait(1.0):
                try:
                    trickler.send(b"x")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        started = time.monotonic()
        try:
            assert payload_channel.fetch(channel.env) == payload
            # The fetch does not wait for the idle peers' handshake deadline (5 s) to pass.
            assert time.monotonic() - started < 4.0
        finally:
            stop.set()
            for connection in idle + [trickler]:
                connection.close()


@pytest.mark.parametrize("with_key", [False, True])
def test_a_peer_announcing_2_to_the_62_bytes_leaves_the_listeners_memory_flat(with_key):
    with payload_channel.JobChannel(None, local_only=True) as channel:
        host, port = channel.env[payload_channel.ADDRESSES_ENV].rsplit(":", 1)
        before = resident_bytes()
        for _ in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as connection:
                if with_key:
                    open_session(connection, bytes.fromhex(channel.env[payload_channel.KEY_ENV]),
                                 payload_channel._ROLES, "test", handshake_deadline(10))
                    connection.sendall(HEADER.pack(0xFFFFFFFF, b"L") + struct.pack("!Q", 1 << 62))
                else:
                    connection.sendall(b"P" + bytes(16) + struct.pack("!Q", 1 << 62) + bytes(64))
                connection.settimeout(10)
                try:
                    while connection.recv(1 << 16):
                        pass  # until the channel drops it
                except ConnectionResetError:
                    pass  # dropped with our bytes unread
        assert resident_bytes() - before < 32 << 20
        token = payload_channel.post(channel.env, b"still served")
        assert channel.taken(token) == b"still served"


def test_a_key_holder_that_goes_quiet_is_dropped(monkeypatch):
    # After its handshake a peer must send its request: a quiet one is dropped after the
    # channel's wait for a frame (shortened here), and so cannot hold a thread for the job.
    monkeypatch.setattr(payload_channel, "_QUIET_PEER_SECONDS", 0.5)
    with payload_channel.JobChannel(None, local_only=True) as channel:
        host, port = channel.env[payload_channel.ADDRESSES_ENV].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            open_session(connection, bytes.fromhex(channel.env[payload_channel.KEY_ENV]),
                         payload_channel._ROLES, "test", handshake_deadline(10))
            connection.settimeout(10)
            started = time.monotonic()
            assert connection.recv(1) == b""  # the channel closed its end
            assert time.monotonic() - started < 8  # a hang guard: 0.5 s, plus a busy machine's delays


def test_a_fake_spark_board_never_learns_the_key_nor_gets_a_command_run(tmp_path):
    from hvdplus.spark.elastic import join_board

    key = secrets.token_bytes(32)
    fake = socket.create_server(("127.0.0.1", 0))
    heard = bytearray()
    marker = tmp_path / "ran"

    def pose_as_the_board():
        connection, _ = fake.accept()
        with connection:
            connection.settimeout(10)
            heard.extend(connection.recv(1 << 16))
            # Its own nonce and a proof it cannot make, then a command in the old clear protocol.
            connection.sendall(os.urandom(64) + f'{{"command": "touch {marker}"}}\n'.encode())
            try:
                while data := connection.recv(1 << 16):
                    heard.extend(data)
            except OSError:
                pass

    poser = threading.Thread(target=pose_as_the_board, daemon=True)
    poser.start()
    with pytest.raises(ConnectionError, match="does not hold this job's key"):
        join_board(fake.getsockname(), key, "task-0")
    poser.join(10)
    fake.close()
    assert key not in heard and key.hex().encode() not in heard
    assert len(heard) == 32  # the task's nonce, and nothing after it
    assert not marker.exists()


def test_bad_input_never_stops_the_spark_board():
    from hvdplus.spark.elastic import _TaskBoard, join_board

    board = _TaskBoard("127.0.0.1")
    try:
        for junk in (b"{not json\n", b"x" * (8 << 20), os.urandom(200)):
            with socket.create_connection(board.address, timeout=10) as connection:
                try:
                    connection.sendall(junk)
                    connection.recv(1 << 16)
                except OSError:
                    pass  # dropped, as it should be
        session = join_board(board.address, board.key, "task-0")
        deadline = time.monotonic() + 10
        while board.hosts() != ["task-0"]:
            assert time.monotonic() < deadline, "the board stopped admitting tasks"
            time.sleep(0.05)
        with session.connection:
            reply = {}
            ran = threading.Thread(target=lambda: reply.setdefault("status", board.run_daemon("task-0", "true")))
            ran.start()
            assert json.loads(session.receive(limit=1 << 20)) == {"command": "true"}
            session.send(b'{"status": 3}')
            ran.join(10)
            assert reply["status"] == 3
    finally:
        board.close()


LISTENER_OUT_OF_FILES = r"""
import logging, os, resource, socket, sys, threading, time
from hvdplus.common.keyed_handshake import serve_connections
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
listener = socket.create_server(("127.0.0.1", 0), backlog=64)
held = []

def handle(connection, proved):
    proved()
    held.append(connection)
    connection.sendall(b"served\n")
    if len(held) == 1:  # the first one holds its file until the flood has hit the limit
        time.sleep(1.5)
    connection.close()

open_files = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
resource.setrlimit(resource.RLIMIT_NOFILE, (open_files + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
threading.Thread(target=serve_connections, args=(listener, handle, "test-listener"), daemon=True).start()
print(listener.getsockname()[1], flush=True)
time.sleep(30)
"""


def test_a_listener_out_of_files_logs_once_and_goes_on_serving():
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", LISTENER_OUT_OF_FILES], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        connections = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(3)]
        for connection in connections:  # each is served once the first frees its file
            assert connection.makefile("rb").readline() == b"served\n"
            connection.close()
    finally:
        server.kill()
        _, errors = server.communicate(timeout=10)
    assert errors.count("accept() failed, still listening") == 1, errors
    assert "Too many open files" in errors
