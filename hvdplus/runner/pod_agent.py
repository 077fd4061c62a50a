"""`hvdplus agent`: what every pod of a Kubernetes job runs, so that mpirun in the launching pod
starts its daemons in the others with no ssh server, no ssh client and no root.

The agent listens on one TCP port (HVDPLUS_AGENT_PORT, 7075 unless set) in the pod network.
mpirun runs `hvdplus agent-connect HOST COMMAND...` in place of ssh (PRTE_MCA_plm_ssh_agent,
see pod_connect); that connects to HOST's agent, and the two prove to each other that they hold
the job's key (the file HVDPLUS_AGENT_KEY_FILE names, mounted from a Secret; see
hvdplus.common.keyed_handshake). Only then does the agent read the command, run it with
/bin/sh as the pod's user, send its output back as it comes, and end the session with its exit
status, as an ssh session would. When the connection drops first (mpirun is gone), the command's
processes are ended.

In an Indexed Job every pod runs the same command line; the pod with JOB_COMPLETION_INDEX 0 also
writes the job's hostfile (`<job>-<i>.<service> slots=S` for each pod) and runs the launcher
given after `--`, and the agent ends with the launcher's status:

    hvdplus agent --hostfile /tmp/hvdplus/hostfile -- hvdplusrun --hostfile /tmp/hvdplus/hostfile python train.py
"""

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import zlib
from typing import Callable, List, Optional, Sequence

from ..common.keyed_handshake import HandshakeRoles, serve_connections, stop_listening
from ..common.secure_channel import SecureSession, accept_session, handshake_deadline

__all__ = ["PORT_ENV", "KEY_FILE_ENV", "DEFAULT_PORT", "ROLES", "read_key", "agent_port", "PodAgent",
           "indexed_job_hostfile", "build_parser", "main"]

PORT_ENV = "HVDPLUS_AGENT_PORT"
KEY_FILE_ENV = "HVDPLUS_AGENT_KEY_FILE"
PODS_ENV = "HVDPLUS_PODS"
SERVICE_ENV = "HVDPLUS_SERVICE"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # what Kubernetes gives each pod of an Indexed Job
DEFAULT_PORT = 7075
ROLES = HandshakeRoles(server=b"hvdplus pod agent", client=b"hvdplus pod launcher")
MIN_KEY_BYTES = 32
# Words that mark a key left as a manifest's example, whatever its length.
PLACEHOLDER_WORDS = ("changeme", "change-me", "change_me", "placeholder", "example", "replace", "your-key",
                     "yourkey", "password", "todo", "xxxx")
# A key that zlib packs into fewer bytes than this repeats itself: far less than 128 random bits
# (32 random bytes, or 64 hex digits, pack into 40 or more; CHANGE-ME repeated into 20).
MIN_PACKED_KEY_BYTES = 32
NAME = "the hvdplus agent's session"
# The messages an agent sends over its secure session: a kind, then the output or the status.
OUTPUT, EXIT = b"O", b"X"
STATUS = struct.Struct("!i")
# The longest command a launcher may send (mpirun's daemon command lines are a few KiB).
MAX_COMMAND_BYTES = 1 << 20
# A peer that has not ended its handshake within this long is dropped, however it trickles.
HANDSHAKE_SECONDS = 5.0
_STOP_GRACE_S = 5.0
READ_BYTES = 65536


def read_key(path: Optional[str]) -> bytes:
    """The job's key: the bytes of the file at `path` (a Secret's key, or the private key the MPI
    Operator makes for the job), without trailing white space; SystemExit when it is missing or
    shorter than 32 bytes, a known placeholder, or too repetitive to hold 128 random bits."""
    if not path:
        raise SystemExit(f"hvdplus agent: no key file: set {KEY_FILE_ENV} to the job's key, mounted from a Secret")
    try:
        with open(path, "rb") as file:
            key = file.read().rstrip()
    except OSError as error:
        raise SystemExit(f"hvdplus agent: cannot read the job's key {path}: {error.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise SystemExit(f"hvdplus agent: the job's key {path} has {len(key)} bytes, fewer than {MIN_KEY_BYTES}: "
                         "put a random one in its Secret (openssl rand -hex 32)")
    lowered = key.lower().decode("latin-1")
    placeholder = next((word for word in PLACEHOLDER_WORDS if word in lowered), None)
    if placeholder is not None:
        raise SystemExit(f"hvdplus agent: the job's key {path} is a placeholder (it holds {placeholder!r}): "
                         "put a random one in its Secret (openssl rand -hex 32)")
    if len(zlib.compress(key, 9)) < MIN_PACKED_KEY_BYTES:
        raise SystemExit(f"hvdplus agent: the job's key {path} repeats itself, too little entropy for a key: "
                         "put a random one in its Secret (openssl rand -hex 32)")
    return key


def agent_port(environ=os.environ) -> int:
    """The agents' port: HVDPLUS_AGENT_PORT, else DEFAULT_PORT."""
    return int(environ.get(PORT_ENV) or DEFAULT_PORT)


class PodAgent:
    """Runs, for each launcher that proves it holds `key`, the command it sends.

    Args:
        key: the job's key.
        port: the TCP port to listen on, on every interface (0: any free one; see `port`).
    """

    def __init__(self, key: bytes, port: int):
        self._key = key
        # Both IPv4 and IPv6 where the pod has both: clusters of either kind exist.
        if socket.has_dualstack_ipv6():
            self._socket = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
        else:
            self._socket = socket.create_server(("", port), backlog=64)
        self.port = self._socket.getsockname()[1]
        self._daemons: List[subprocess.Popen] = []
        self._lock = threading.Lock()

    def serve_forever(self) -> None:
        """Answer connections until `close`."""
        serve_connections(self._socket, self._session, "hvdplus-pod-agent-session")

    def close(self) -> None:
        """Stop listening and end every command still running."""
        stop_listening(self._socket)
        with self._lock:
            daemons = list(self._daemons)
        for daemon in daemons:
            _end_group(daemon)

    def _session(self, connection: socket.socket, proved: Callable[[], None]) -> None:
        with connection:
            try:
                try:
                    session = accept_session(connection, self._key, ROLES, NAME, handshake_deadline(HANDSHAKE_SECONDS))
                finally:
                    proved()
                if session is None:
                    return  # not the job's launcher: it gets nothing
                connection.settimeout(HANDSHAKE_SECONDS)
                command = session.receive(limit=MAX_COMMAND_BYTES).decode()
                connection.settimeout(None)
            except (OSError, UnicodeDecodeError):
                return
            self._run(session, command)

    def _run(self, session: SecureSession, command: str) -> None:
        """Run `command`, relaying its output and then its status; end it if the peer leaves."""
        daemon = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        with self._lock:
            self._daemons.append(daemon)
        # The launcher sends nothing more: the end of its side means it is gone.
        connection = session.connection
        threading.Thread(target=_end_when_closed, args=(connection, daemon), name="hvdplus-pod-agent-peer",
                         daemon=True).start()
        try:
            while chunk := daemon.stdout.read1(READ_BYTES):
                session.send(OUTPUT + chunk)
            session.send(EXIT + STATUS.pack(_exit_status(daemon.wait())))
            session.finish()
        except OSError:
            _end_group(daemon)
        finally:
            with self._lock:
                self._daemons.remove(daemon)


def _exit_status(returncode: int) -> int:
    """A shell's way to say a process ended by signal N: 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _end_when_closed(connection: socket.socket, daemon: subprocess.Popen) -> None:
    try:
        while connection.recv(1):
            pass
    except OSError:
        pass
    if daemon.poll() is None:
        _end_group(daemon)


def _end_group(daemon: subprocess.Popen) -> None:
    """End `daemon` and the processes it started: SIGTERM, then SIGKILL after a grace period."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(daemon.pid, signum)
        except ProcessLookupError:
            return
        try:
            daemon.wait(timeout=_STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def indexed_job_hostfile(hostname: str, index: int, pods: int, service: str, slots: int) -> str:
    """The hostfile of an Indexed Job whose pods are named `<job>-<i>` under the headless
    Service `service`, seen from the pod `hostname` of index `index`.

    Args:
        hostname: this pod's host name, `<job>-<index>` (Kubernetes names an Indexed Job's pods so).
        index: this pod's JOB_COMPLETION_INDEX.
        pods: how many pods the job has (its parallelism).
        service: the headless Service, the pods' subdomain.
        slots: ranks per pod.
    """
    suffix = f"-{index}"
    if not hostname.endswith(suffix):
        raise SystemExit(f"hvdplus agent: host name {hostname!r} does not end with -{index}: is this pod one of an "
                         "Indexed Job with a subdomain?")
    job = hostname[:-len(suffix)]
    return "".join(f"{job}-{pod}.{service} slots={slots}\n" for pod in range(pods))


def build_parser(prog: str = "hvdplus agent") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Start mpirun's daemons in this pod for the job's "
                                     "launcher; in an Indexed Job's pod 0, run the launcher too.")
    parser.add_argument("--port", type=int, default=None, help=f"port to listen on (default: ${PORT_ENV}, "
                        f"else {DEFAULT_PORT})")
    parser.add_argument("--key-file", default=os.environ.get(KEY_FILE_ENV),
                        help=f"the job's key, mounted from a Secret (default: ${KEY_FILE_ENV})")
    parser.add_argument("--hostfile", help="in pod 0, write the Indexed Job's hostfile here before the launcher runs")
    parser.add_argument("--pods", type=int, default=None, help=f"pods in the job (default: ${PODS_ENV})")
    parser.add_argument("--service", default=None, help=f"the headless Service (default: ${SERVICE_ENV})")
    parser.add_argument("--slots", type=int, default=1, help="ranks per pod, e.g. its GPUs (default: 1)")
    parser.add_argument("launcher", nargs=argparse.REMAINDER,
                        help="after --: the launcher that pod 0 runs (hvdplusrun ...)")
    return parser


def _write_hostfile(args: argparse.Namespace, index: int) -> None:
    pods = args.pods or int(os.environ.get(PODS_ENV) or 0)
    service = args.service or os.environ.get(SERVICE_ENV)
    if not pods or not service:
        raise SystemExit(f"hvdplus agent: --hostfile needs --pods (or ${PODS_ENV}) and --service (or ${SERVICE_ENV})")
    os.makedirs(os.path.dirname(os.path.abspath(args.hostfile)), exist_ok=True)
    with open(args.hostfile, "w") as file:
        file.write(indexed_job_hostfile(socket.gethostname(), index, pods, service, args.slots))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`hvdplus agent`: serve until stopped (SIGTERM, as Kubernetes stops a pod); in pod 0 with a
    launcher given, until the launcher ends, with its status."""
    args = build_parser().parse_args(argv)
    launcher = args.launcher[1:] if args.launcher[:1] == ["--"] else args.launcher
    agent = PodAgent(read_key(args.key_file), args.port if args.port is not None else agent_port())
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    serving = threading.Thread(target=agent.serve_forever, name="hvdplus-pod-agent", daemon=True)
    serving.start()
    print(f"hvdplus agent: listening on port {agent.port}", file=sys.stderr, flush=True)
    try:
        if launcher and os.environ.get(INDEX_ENV, "0") == "0":
            if args.hostfile:
                _write_hostfile(args, 0)
            return subprocess.call(launcher)
        serving.join()
        return 0
    finally:
        agent.close()
