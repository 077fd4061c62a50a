"""`hvdplus agent-connect`: the launch agent mpirun runs in place of ssh on Kubernetes
(PRTE_MCA_plm_ssh_agent="hvdplus agent-connect"), once per other pod.

    hvdplus agent-connect [--connect-timeout=SECONDS] HOST COMMAND...

It connects to the `hvdplus agent` of pod HOST (hvdplus.runner.pod_agent) at the agents' port,
trying again until the agent listens or the timeout passes (a pod that is scheduled but not yet
started), proves that it holds the job's key and checks that the agent does too, has the agent
run COMMAND, copies the command's output to its own standard error, and exits with the
command's status, as ssh would. Leading options it does not know (those mpirun gives ssh, such
as -x) are passed over.
"""

import os
import socket
import sys
import time
from typing import Optional, Sequence

from ..common.secure_channel import handshake_deadline, open_session
from . import pod_agent as agent
from . import pod_protocol as protocol

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "connect", "run_remote", "main"]

DEFAULT_CONNECT_TIMEOUT_S = 60.0
_RETRY_S = 0.5
_ATTEMPT_S = 5.0
# The status ssh exits with when it cannot reach the host or log in.
_UNREACHABLE = 255


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connection to the agent at `host`:`port`, tried until it succeeds or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=_ATTEMPT_S)
        except OSError as error:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no hvdplus agent answered at {host}:{port} within {timeout:g} s: "
                                      f"{error}") from None
        time.sleep(_RETRY_S)


def run_remote(connection: socket.socket, key: bytes, command: str, output) -> int:
    """Have the agent at the other end of `connection` run `command`; write its output to
    `output` (a binary file) as it comes; its exit status."""
    encoded = command.encode()
    if len(encoded) > protocol.MAX_COMMAND_BYTES:
        raise ValueError(f"the command has {len(encoded)} bytes, more than an agent takes "
                         f"({protocol.MAX_COMMAND_BYTES})")
    session = open_session(connection, key, protocol.ROLES, protocol.NAME,
                           handshake_deadline(protocol.HANDSHAKE_SECONDS))
    session.send(protocol.RUN + encoded)
    connection.settimeout(None)
    while True:
        message = session.receive(limit=1 + protocol.READ_BYTES)
        kind, data = message[:1], message[1:]
        if kind == protocol.EXIT and len(data) == protocol.STATUS.size:
            status = protocol.STATUS.unpack(data)[0]
            session.expect_end()
            return status
        if kind != protocol.OUTPUT:
            raise ConnectionError(f"{protocol.NAME}: a message of no known kind")
        output.write(data)
        output.flush()


def _split_arguments(argv: Sequence[str]):
    """(connect timeout, host, command words) from the agent's command line."""
    words = list(argv)
    timeout = DEFAULT_CONNECT_TIMEOUT_S
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option.startswith("--connect-timeout="):
            timeout = float(option.split("=", 1)[1])
    if len(words) < 2:
        raise SystemExit("usage: hvdplus agent-connect [--connect-timeout=SECONDS] HOST COMMAND...")
    return timeout, words[0], words[1:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    timeout, host, command = _split_arguments(sys.argv[1:] if argv is None else argv)
    key = agent.read_key(os.environ.get(agent.KEY_FILE_ENV))
    try:
        with connect(host, agent.agent_port(), timeout) as connection:
            return run_remote(connection, key, " ".join(command), sys.stderr.buffer)
    except (OSError, ValueError) as error:
        print(f"hvdplus agent-connect: {host}: {error}", file=sys.stderr, flush=True)
        return _UNREACHABLE
