"""The port through which `hvdplus.run` serves a large payload to rank 0: it gives the payload
to a peer that holds the job's key, whole and checked, and nothing to one that does not."""

import hashlib
import hmac
import os
import socket

import pytest

from hvdplus.common import function_payload, payload_channel

pytestmark = pytest.mark.timeout(60)


def test_a_rank_with_the_jobs_key_fetches_the_payload_whole():
    payload = os.urandom(3 << 20)
    with payload_channel.JobChannel(payload, local_only=True) as server:
        assert payload_channel.has_channel(server.env)
        assert bytes(payload_channel.fetch(server.env)) == payload
        assert bytes(payload_channel.fetch(server.env)) == payload  # each launch's rank 0 fetches it again


def test_a_local_job_is_served_on_loopback_only():
    with payload_channel.JobChannel(b"x", local_only=True) as server:
        assert server.env[payload_channel.ADDRESSES_ENV].startswith("127.0.0.1:")
        assert "," not in server.env[payload_channel.ADDRESSES_ENV]


def test_a_peer_without_the_key_gets_no_byte_of_the_payload():
    payload = b"secret" * 1000
    with payload_channel.JobChannel(payload, local_only=True) as server:
        host, port = server.env[payload_channel.ADDRESSES_ENV].split(",")[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as peer:
            peer.sendall(os.urandom(32))
            greeting = b""
            while len(greeting) < 64:
                greeting += peer.recv(64 - len(greeting))
            wrong = hmac.new(os.urandom(32), b"hvdplus payload client" + greeting[:32], hashlib.sha256).digest()
            peer.sendall(wrong)
            peer.settimeout(10)
            assert peer.recv(1 << 16) == b""  # closed at once, with nothing sent
        # Nor does a peer that holds a wrong key reach it through fetch.
        forged = dict(server.env, **{payload_channel.KEY_ENV: os.urandom(32).hex()})
        with pytest.raises(ConnectionError, match="does not hold this job's key"):
            payload_channel.fetch(forged)
        with pytest.raises(ConnectionError, match="does not hold this job's key"):
            payload_channel.post(forged, b"data")


def test_a_damaged_payload_is_refused():
    with payload_channel.JobChannel(b"payload", local_only=True) as server:
        damaged = dict(server.env, **{payload_channel.DIGEST_ENV: hashlib.sha256(b"other").hexdigest()})
        with pytest.raises(ConnectionError, match="arrived damaged"):
            payload_channel.fetch(damaged)


def test_no_server_is_named_within_the_connect_timeout():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    environ = {payload_channel.ADDRESSES_ENV: f"127.0.0.1:{port}", payload_channel.KEY_ENV: "00" * 32,
               payload_channel.DIGEST_ENV: "", payload_channel.SIZE_ENV: "0"}
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        payload_channel.fetch(environ)


@pytest.mark.parametrize("size", [0, 1000, function_payload.ENVIRONMENT_BYTES])
def test_a_small_payload_rides_in_the_environment(size):
    payload = os.urandom(size)
    environ = function_payload.to_environment(payload)
    assert function_payload.in_environment(environ) and not payload_channel.has_channel(environ)
    assert function_payload.from_environment(environ) == payload


def test_a_large_payload_is_refused_by_the_environment():
    with pytest.raises(ValueError, match="job's channel"):
        function_payload.to_environment(bytes(function_payload.ENVIRONMENT_BYTES + 1))


def test_what_a_rank_posts_is_taken_once_by_its_token():
    data = os.urandom(5 << 20)
    with payload_channel.JobChannel(None, local_only=True) as channel:
        first, second = payload_channel.post(channel.env, data), payload_channel.post(channel.env, b"")
        assert bytes(channel.taken(first)) == data and bytes(channel.taken(second)) == b""
        with pytest.raises(KeyError):
            channel.taken(first)


def test_the_channel_closes_with_the_job():
    with payload_channel.JobChannel(b"payload", local_only=True) as channel:
        environ = channel.env
    with pytest.raises(ConnectionError, match="no address"):
        payload_channel.fetch(environ)


def test_a_channel_for_other_hosts_listens_only_where_they_reach_it_and_names_no_loopback():
    outward = [address for address in payload_channel.local_addresses() if not address.startswith("127.")]
    with payload_channel.JobChannel(b"payload", local_only=False, hosts=[socket.gethostname()]) as channel:
        addresses = channel.env[payload_channel.ADDRESSES_ENV].split(",")
        port = int(addresses[0].rsplit(":", 1)[1])
        bound = {listener.getsockname()[0] for listener in channel._sockets}
        assert "0.0.0.0" not in bound
        if outward:  # a machine with a network: ranks elsewhere never try loopback, nor is it served
            assert not any(address.startswith("127.") for address in addresses)
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert payload_channel.fetch(channel.env) == b"payload"
