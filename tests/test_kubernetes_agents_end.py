"""The end of an Indexed Job without `successPolicy` (hvdplus.runner.launcher_finished): a real
`hvdplus agent` process on loopback, serving as pod 1 would, is told over a real keyed session
that pod 0's launcher finished, and exits 0, after the commands it runs have ended or its grace
has passed; a peer without the job's key cannot end it. tests/test_kubernetes.py runs the whole
Indexed Job this way, as containers."""

import io
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from hvdplus.runner import launcher_finished, pod_connect, pod_protocol

KEY = b"3f9c1a7e52d8b6040e1f7a9c3d5b2e8a6c4f0d1b9e7a5c3f1d2e4b6a8c0e9f7d"
WRONG_KEY = b"a1c3e5f7092b4d6f8a0c2e4f6b8d0a2c4e6f8b0d2a4c6e8f0b2d4a6c8e0f2b4d"
# Seconds for an agent to exit once told; it exits at once when nothing runs.
EXIT_S = 30


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_agent(tmp_path, port, *options):
    key_file = tmp_path / f"key-{port}"
    key_file.write_bytes(KEY)
    env = dict(os.environ, HVDPLUS_AGENT_KEY_FILE=str(key_file), HVDPLUS_AGENT_PORT=str(port),
               JOB_COMPLETION_INDEX="1")
    return subprocess.Popen([sys.executable, "-m", "hvdplus.runner.hvdplus_command", "agent", *options], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until_listening(port, process, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, f"no agent listened on {port} within {timeout} s"
            time.sleep(0.1)


def wait_for_file(path, timeout=10):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"the command did not start: no {path}"
        time.sleep(0.05)


def assert_listening(port, process):
    assert process.poll() is None, process.communicate()[0]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        assert pod_connect.run_remote(connection, KEY, "echo still serving", io.BytesIO()) == 0


@pytest.fixture
def pod_1(tmp_path):
    """An agent serving as pod 1 of an Indexed Job, with a 3 s grace for its commands."""
    port = free_port()
    process = start_agent(tmp_path, port, "--finish-grace", "3")
    try:
        wait_until_listening(port, process)
        yield port, process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.timeout(120)
def test_a_serving_agent_exits_0_once_told_that_the_launcher_finished(pod_1):
    port, process = pod_1
    assert launcher_finished.tell_agents(["127.0.0.1"], port, KEY) == []
    output = process.communicate(timeout=EXIT_S)[0]
    assert process.returncode == 0, output
    assert "pod 0's launcher finished" in output
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.timeout(120)
def test_a_peer_without_the_key_cannot_end_an_agent(pod_1):
    port, process = pod_1
    with pytest.raises(ConnectionError):
        launcher_finished.tell_agent("127.0.0.1", port, WRONG_KEY, timeout=10)
    # The notice's bytes with no handshake before them are no notice either.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(pod_protocol.LAUNCHER_FINISHED * 200)
        connection.settimeout(10)
        try:
            while connection.recv(4096):
                pass
        except ConnectionResetError:
            pass  # refused mid-handshake
    assert_listening(port, process)
    # The key's holder still can; an agent no longer listening is reported as not told.
    assert launcher_finished.tell_agents(["127.0.0.1"], port, KEY) == []
    assert process.wait(timeout=EXIT_S) == 0
    assert launcher_finished.tell_agents(["127.0.0.1"], port, KEY, timeout=2) == ["127.0.0.1"]


@pytest.mark.timeout(120)
def test_a_command_still_running_ends_by_itself_within_the_grace(pod_1, tmp_path):
    port, process = pod_1
    begun = tmp_path / "begun"
    results = {}

    def run_command():
        output = io.BytesIO()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            results["status"] = pod_connect.run_remote(connection, KEY, f"echo begun; touch {begun}; sleep 1; "
                                                       "echo ended", output)
        results["output"] = output.getvalue()

    runner = threading.Thread(target=run_command)
    runner.start()
    wait_for_file(begun)
    assert launcher_finished.tell_agents(["127.0.0.1"], port, KEY) == []
    runner.join(timeout=EXIT_S)
    assert results == {"status": 0, "output": b"begun\nended\n"}
    assert process.wait(timeout=EXIT_S) == 0


@pytest.mark.timeout(120)
def test_a_command_that_outlasts_the_grace_is_ended_and_the_agent_exits_0(pod_1, tmp_path):
    port, process = pod_1
    pid_file = tmp_path / "sleeper"
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    outcomes = []

    def run_command():
        try:
            outcomes.append(pod_connect.run_remote(connection, KEY, f"sleep 600 & echo $! > {pid_file}.new; "
                                                   f"mv {pid_file}.new {pid_file}; wait", io.BytesIO()))
        except ConnectionError as error:
            outcomes.append(error)

    runner = threading.Thread(target=run_command)
    runner.start()
    try:
        wait_for_file(pid_file)
        sleeper = int(pid_file.read_text())
        told = time.monotonic()
        assert launcher_finished.tell_agents(["127.0.0.1"], port, KEY) == []
        assert process.wait(timeout=EXIT_S) == 0
        # The grace is 3 s: the agent waited for it, then ended the command, whose launcher
        # hears of it as status 143 (SIGTERM) or as a session cut as the agent exits.
        assert time.monotonic() - told >= 3
        runner.join(timeout=EXIT_S)
        (outcome,) = outcomes
        assert outcome == 143 or isinstance(outcome, ConnectionError), outcome
        # Ended: gone, or a zombie that its new parent has yet to reap.
        assert not os.path.exists(f"/proc/{sleeper}") or "zombie" in open(f"/proc/{sleeper}/status").read()
    finally:
        connection.close()
