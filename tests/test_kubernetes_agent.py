"""The pieces of hvdplus on Kubernetes that run without containers: the pod agent and its
launch agent over a real socket on this machine (hvdplus.runner.pod_agent, pod_connect), the
Indexed Job's hostfile, and the launcher's wait for host names to resolve (name_resolution),
which the MPI Operator's users meet as its most common failure."""

import base64
import io
import os
import socket
import subprocess
import sys
import threading
import time

import secrets

import pytest

from hvdplus.runner import name_resolution, pod_agent, pod_connect
from hvdplus.runner.errors import LaunchError

from testkit import timing

KEY = secrets.token_hex(32).encode()  # as `openssl rand -hex 32` makes a Secret's key


@pytest.fixture
def agent():
    served = pod_agent.PodAgent(KEY, 0)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield served
    served.close()


def run_through(agent, command, key=KEY):
    output = io.BytesIO()
    with pod_connect.connect("127.0.0.1", agent.port, timeout=5) as connection:
        status = pod_connect.run_remote(connection, key, command, output)
    return status, output.getvalue().decode()


def test_the_agent_runs_the_launchers_command_and_relays_its_output_and_status(agent):
    status, output = run_through(agent, "echo from the pod; echo to stderr >&2; exit 7")
    assert status == 7
    assert output.splitlines() == ["from the pod", "to stderr"]


def test_the_agent_runs_nothing_for_a_launcher_without_the_key(agent, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ConnectionError, match="does not hold this job's key"):
        run_through(agent, f"touch {marker}", key=b"f" * 64)
    time.sleep(0.3)
    assert not marker.exists()
    assert run_through(agent, "true") == (0, "")  # and goes on serving


def test_the_agent_ends_the_command_when_the_launcher_goes_away(agent, tmp_path):
    pid_file = tmp_path / "pid"
    connection = pod_connect.connect("127.0.0.1", agent.port, timeout=5)
    thread = threading.Thread(target=lambda: pytest.raises(
        OSError, pod_connect.run_remote, connection, KEY, f"sleep 60 & echo $! > {pid_file}; wait", io.BytesIO()))
    thread.start()
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    sleeper = int(pid_file.read_text())
    connection.shutdown(socket.SHUT_RDWR)
    connection.close()
    thread.join(10)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{sleeper}") and "zombie" not in open(f"/proc/{sleeper}/status").read():
        assert time.monotonic() < deadline, "the command's processes outlived the launcher's connection"
        time.sleep(0.1)


def test_agent_connect_waits_for_an_agent_that_starts_late():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = []

    def start_late():
        time.sleep(1.0)
        started.append(pod_agent.PodAgent(KEY, port))
        started[0].serve_forever()

    threading.Thread(target=start_late, daemon=True).start()
    try:
        with pod_connect.connect("127.0.0.1", port, timeout=10) as connection:
            assert pod_connect.run_remote(connection, KEY, "exit 3", io.BytesIO()) == 3
    finally:
        started[0].close()


def test_agent_connect_gives_ssh_s_status_when_no_agent_answers(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    env = dict(os.environ, HVDPLUS_AGENT_KEY_FILE=str(key_file), HVDPLUS_AGENT_PORT="1")
    result = subprocess.run([sys.executable, "-m", "hvdplus.runner.hvdplus_command", "agent-connect", "-x",
                             "--connect-timeout=0.5", "127.0.0.1", "true"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 255
    assert "no hvdplus agent answered at 127.0.0.1:1" in result.stderr


@pytest.mark.parametrize("content, reason", [
    (b"CHANGE-ME\n", "9 bytes, fewer than 32"),
    (b"CHANGE-ME" * 8, "is a placeholder"),  # 72 bytes: long enough, and still the manifest's example
    ((b"CHANGE-ME" * 8)[:64], "is a placeholder"),
    (b"0123456789abcdef" * 4, "repeats itself"),
    (b"a" * 64, "repeats itself"),
])
def test_the_agent_refuses_a_placeholder_or_low_entropy_key_whatever_its_length(tmp_path, content, reason):
    key_file = tmp_path / "key"
    key_file.write_bytes(content)
    with pytest.raises(SystemExit, match=reason):
        pod_agent.read_key(str(key_file))


def test_the_agent_takes_random_keys_as_openssl_makes_them(tmp_path):
    key_file = tmp_path / "key"
    for _ in range(200):
        key = secrets.token_hex(32).encode()
        key_file.write_bytes(key + b"\n")
        assert pod_agent.read_key(str(key_file)) == key
        key_file.write_bytes(base64.b64encode(secrets.token_bytes(32)))
        pod_agent.read_key(str(key_file))


def test_the_indexed_job_hostfile_names_every_pod_under_its_service():
    assert pod_agent.indexed_job_hostfile("train-0", 0, 3, "train", 2) == (
        "train-0.train slots=2\ntrain-1.train slots=2\ntrain-2.train slots=2\n")
    with pytest.raises(SystemExit, match="does not end with -0"):
        pod_agent.indexed_job_hostfile("laptop", 0, 3, "train", 1)


def test_a_name_that_never_resolves_fails_within_the_timeout_naming_it():
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"did not resolve within 0.5 s: late-1, late-2 \("):
        name_resolution.wait_for_host_names(["late-1", "here", "late-2"], timeout=0.5,
                                            resolves=lambda name: name == "here", poll_s=0.05)
    timing.assert_took_under(time.monotonic() - start, 2, quiet=0.5, what="a 0.5 s name-resolution timeout")


def test_a_name_that_resolves_later_is_waited_for():
    calls = []

    def resolves(name):
        calls.append(name)
        return len(calls) > 4

    name_resolution.wait_for_host_names(["worker-0.job"], timeout=10, resolves=resolves, poll_s=0.01)
    assert len(calls) == 5


def test_hvdplusrun_stops_before_mpirun_naming_the_host_that_does_not_resolve():
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "hvdplus.runner", "--host-resolution-timeout", "1",
                             "-H", "localhost:1,no-such-pod.hvdplus-test.invalid:1", "python", "-c", "pass"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "did not resolve within 1 s: no-such-pod.hvdplus-test.invalid (" in result.stderr
    timing.assert_took_under(time.monotonic() - start, 30, quiet=1.7, what="hvdplusrun refusing an unresolved host")


def test_the_resolution_timeout_comes_from_the_environment(monkeypatch):
    args = name_resolution.argparse.Namespace(host_resolution_timeout=None)
    monkeypatch.setenv(name_resolution.TIMEOUT_ENV, "2.5")
    assert name_resolution.timeout_from(args) == 2.5
    monkeypatch.setenv(name_resolution.TIMEOUT_ENV, "soon")
    with pytest.raises(LaunchError, match="HVDPLUS_HOST_RESOLUTION_TIMEOUT='soon'"):
        name_resolution.timeout_from(args)


def test_the_default_resolution_timeout_is_longer_in_a_kubernetes_pod(monkeypatch):
    args = name_resolution.argparse.Namespace(host_resolution_timeout=None)
    monkeypatch.delenv(name_resolution.TIMEOUT_ENV, raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert name_resolution.timeout_from(args) == 10.0  # a mistyped -H is named soon
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert name_resolution.timeout_from(args) == 60.0
