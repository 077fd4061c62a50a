"""`hvdplus agent`: what every pod of a Kubernetes job runs, so that mpirun in the launching pod
starts its daemons in the others with no ssh server, no ssh client and no root.

The agent listens on one TCP port (HVDPLUS_AGENT_PORT, 7075 unless set) in the pod network.
mpirun runs `hvdplus agent-connect HOST COMMAND...` in place of ssh (PRTE_MCA_plm_ssh_agent,
see pod_connect); that connects to HOST's agent, and the two prove to each other that they hold
the job's key (the file HVDPLUS_AGENT_KEY_FILE names, mounted from a Secret; see
hvdplus.common.keyed_handshake). Only then does the agent read the command, run it with
/bin/sh as the pod's user, send its output back as it comes, and end the session with its exit
status, as an ssh session would. When the connection drops first (mpirun is gone), the command's
processes are ended. What the two say is in hvdplus.runner.pod_protocol.

In an Indexed Job every pod runs the same command line; the pod with JOB_COMPLETION_INDEX 0 also
writes the job's hostfile (`<job>-<i>.<service> slots=S` for each pod) and runs the launcher
given after `--`, and the agent ends with the launcher's status:

    hvdplus agent --hostfile /tmp/hvdplus/hostfile -- hvdplusrun --hostfile /tmp/hvdplus/hostfile python train.py

When that launcher exits 0, pod 0 tells every other pod's agent so over the keyed session
(hvdplus.runner.launcher_finished); each then stops listening, gives the commands it still runs
up to --finish-grace seconds to end, and exits 0, so that the Job completes without
`successPolicy`.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from typing import Callable, List, Optional, Sequence

from ..common.keyed_handshake import serve_connections, stop_listening
from ..common.secure_channel import SecureSession, accept_session, handshake_deadline
from . import launcher_finished
from . import pod_protocol as protocol

__all__ = ["PORT_ENV", "KEY_FILE_ENV", "DEFAULT_PORT", "DEFAULT_FINISH_GRACE_S", "read_key", "agent_port",
           "PodAgent", "indexed_job_hosts", "indexed_job_hostfile", "build_parser", "main"]

PORT_ENV = "HVDPLUS_AGENT_PORT"
KEY_FILE_ENV = "HVDPLUS_AGENT_KEY_FILE"
PODS_ENV = "HVDPLUS_PODS"
SERVICE_ENV = "HVDPLUS_SERVICE"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # what Kubernetes gives each pod of an Indexed Job
DEFAULT_PORT = 7075
# How long an agent told that the launcher finished lets the commands it runs end by themselves
# (mpirun's daemons end with mpirun, a moment later).
DEFAULT_FINISH_GRACE_S = 30.0
MIN_KEY_BYTES = 32
# Words that mark a key left as a manifest's example, whatever its length.
PLACEHOLDER_WORDS = ("changeme", "change-me", "change_me", "placeholder", "example", "replace", "your-key",
                     "yourkey", "password", "todo", "xxxx")
# A key that zlib packs into fewer bytes than this repeats itself: far less than 128 random bits
# (32 random bytes, or 64 hex digits, pack into 40 or more; CHANGE-ME repeated into 20).
MIN_PACKED_KEY_BYTES = 32
_STOP_GRACE_S = 5.0
_WAIT_POLL_S = 0.1


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
    """Runs, for each launcher that proves it holds `key`, the command it sends; `finished` is
    set when a holder of `key` says that pod 0's launcher has exited 0.

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
        self.finished = threading.Event()

    def serve_forever(self) -> None:
        """Answer connections until `close`."""
        serve_connections(self._socket, self._session, "hvdplus-pod-agent-session")

    def end(self, grace_s: float) -> None:
        """Stop listening, give the commands still running up to `grace_s` seconds to end by
        themselves, then end those left (`close`).

        Args:
            grace_s: seconds to wait for the running commands.
        """
        stop_listening(self._socket)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._daemons:
                    break
            time.sleep(_WAIT_POLL_S)
        self.close()

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
                    session = accept_session(connection, self._key, protocol.ROLES, protocol.NAME,
                                             handshake_deadline(protocol.HANDSHAKE_SECONDS))
                finally:
                    proved()
                if session is None:
                    return  # not the job's launcher: it gets nothing
                connection.settimeout(protocol.HANDSHAKE_SECONDS)
                request = session.receive(limit=1 + protocol.MAX_COMMAND_BYTES)
                kind = bytes(request[:1])
                if kind == protocol.LAUNCHER_FINISHED and len(request) == 1:
                    # Acknowledged before the main thread ends the agent, so the teller knows.
                    session.send(protocol.EXIT + protocol.STATUS.pack(0))
                    session.finish()
                    self.finished.set()
                    return
                if kind != protocol.RUN:
                    return
                command = request[1:].decode()
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
            while chunk := daemon.stdout.read1(protocol.READ_BYTES):
                session.send(protocol.OUTPUT + chunk)
            session.send(protocol.EXIT + protocol.STATUS.pack(_exit_status(daemon.wait())))
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


def indexed_job_hosts(hostname: str, index: int, pods: int, service: str) -> List[str]:
    """The host names of every pod of an Indexed Job whose pods are named `<job>-<i>` under the
    headless Service `service`, by index, seen from the pod `hostname` of index `index`.

    Args:
        hostname: this pod's host name, `<job>-<index>` (Kubernetes names an Indexed Job's pods so).
        index: this pod's JOB_COMPLETION_INDEX.
        pods: how many pods the job has (its parallelism).
        service: the headless Service, the pods' subdomain.
    """
    suffix = f"-{index}"
    if not hostname.endswith(suffix):
        raise SystemExit(f"hvdplus agent: host name {hostname!r} does not end with -{index}: is this pod one of an "
                         "Indexed Job with a subdomain?")
    job = hostname[:-len(suffix)]
    return [f"{job}-{pod}.{service}" for pod in range(pods)]


def indexed_job_hostfile(hostname: str, index: int, pods: int, service: str, slots: int) -> str:
    """The hostfile of that Indexed Job (`indexed_job_hosts`), `slots` ranks per pod.

    Args:
        hostname: this pod's host name.
        index: this pod's JOB_COMPLETION_INDEX.
        pods: how many pods the job has.
        service: the headless Service.
        slots: ranks per pod.
    """
    return "".join(f"{host} slots={slots}\n" for host in indexed_job_hosts(hostname, index, pods, service))


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
    parser.add_argument("--finish-grace", type=float, default=DEFAULT_FINISH_GRACE_S,
                        help="seconds the commands still running get to end once pod 0 says its launcher "
                        f"finished (default: {DEFAULT_FINISH_GRACE_S:g})")
    parser.add_argument("launcher", nargs=argparse.REMAINDER,
                        help="after --: the launcher that pod 0 runs (hvdplusrun ...)")
    return parser


def _pods_and_service(args: argparse.Namespace):
    return args.pods or int(os.environ.get(PODS_ENV) or 0), args.service or os.environ.get(SERVICE_ENV)


def _write_hostfile(args: argparse.Namespace, index: int) -> None:
    pods, service = _pods_and_service(args)
    if not pods or not service:
        raise SystemExit(f"hvdplus agent: --hostfile needs --pods (or ${PODS_ENV}) and --service (or ${SERVICE_ENV})")
    os.makedirs(os.path.dirname(os.path.abspath(args.hostfile)), exist_ok=True)
    with open(args.hostfile, "w") as file:
        file.write(indexed_job_hostfile(socket.gethostname(), index, pods, service, args.slots))


def _announce_launcher_finished(args: argparse.Namespace, key: bytes, port: int) -> None:
    """Tell the other pods' agents that the launcher exited 0, where the job's pods are known."""
    pods, service = _pods_and_service(args)
    if not pods or not service:
        print(f"hvdplus agent: without --pods (${PODS_ENV}) and --service (${SERVICE_ENV}) the other pods' agents "
              "are not told that the launcher finished", file=sys.stderr, flush=True)
        return
    try:
        others = indexed_job_hosts(socket.gethostname(), 0, pods, service)[1:]
    except SystemExit as error:  # not an Indexed Job's pod 0: the launcher's success stands
        print(f"{error}; the other pods' agents are not told that the launcher finished", file=sys.stderr,
              flush=True)
        return
    launcher_finished.tell_agents(others, port, key)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`hvdplus agent`: serve until stopped (SIGTERM, as Kubernetes stops a pod) or until pod 0
    says its launcher finished (then 0); in pod 0 with a launcher given, until the launcher ends,
    with its status, having told the others when it is 0."""
    args = build_parser().parse_args(argv)
    launcher = args.launcher[1:] if args.launcher[:1] == ["--"] else args.launcher
    key = read_key(args.key_file)
    port = args.port if args.port is not None else agent_port()
    agent = PodAgent(key, port)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    serving = threading.Thread(target=agent.serve_forever, name="hvdplus-pod-agent", daemon=True)
    serving.start()
    print(f"hvdplus agent: listening on port {agent.port}", file=sys.stderr, flush=True)
    try:
        if launcher and os.environ.get(INDEX_ENV, "0") == "0":
            if args.hostfile:
                _write_hostfile(args, 0)
            status = subprocess.call(launcher)
            if status == 0:
                _announce_launcher_finished(args, key, port)
            return status
        # A timed wait, so that SIGTERM's handler runs in this thread while it waits.
        while not agent.finished.wait(timeout=1.0):
            pass
        print("hvdplus agent: pod 0's launcher finished; ending", file=sys.stderr, flush=True)
        agent.end(args.finish_grace)
        return 0
    finally:
        agent.close()
