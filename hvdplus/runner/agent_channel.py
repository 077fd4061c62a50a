"""Where mpirun's launch agents meet the processes that run their daemons (Ray actors, Spark tasks).

An `AgentChannel` is a folder of named pipes (no port is opened): mpirun runs its
`agent_script` in place of ssh, once per host, and each agent (hvdplus.runner.launch_agent) asks
through the folder for that host's daemon; `next_request` hands the requests over, and
`answer` ends the agent with a status, as an ssh session ends. `start_daemon` starts a daemon
command inside the calling process (an actor, a task), so that the ranks it starts are its
children and die with it.

    channel = AgentChannel()
    # mpirun --prtemca plm_ssh_agent <channel.agent_script> ..., with channel.env in its environment
    request = channel.next_request(timeout=30)  # DaemonRequest(host, command, reply), or None
    ...                                         # the host's process runs start_daemon(request.command, request.host)
    channel.answer(request, 0)                  # the agent ends with status 0
    channel.close()
"""

import ctypes
import dataclasses
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from . import launch_agent as agent

__all__ = ["AgentChannel", "DaemonRequest", "start_daemon"]

_PR_SET_PDEATHSIG = 1
_ANSWER_PATIENCE_S = 2.0


@dataclasses.dataclass(frozen=True)
class DaemonRequest:
    """One agent's request: run mpirun's daemon `command` (a shell command line) on `host`.

    Args:
        host: the host name mpirun gave the agent, the name of one worker.
        command: the daemon's command line, for /bin/sh.
        reply: the named pipe on which the agent waits for its status.
    """

    host: str
    command: str
    reply: str


class AgentChannel:
    """A folder of named pipes through which launch agents ask for their daemons."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="hvdplus-agents-")
        self.agent_script = os.path.join(self.path, "agent")
        os.mkfifo(os.path.join(self.path, agent.REQUESTS))
        with open(self.agent_script, "w") as file:
            file.write(f"#!/bin/sh\nexec {sys.executable} -m hvdplus.runner.launch_agent \"$@\"\n")
        os.chmod(self.agent_script, 0o755)
        # Opened for writing too, so that the pipe never ends between two agents' writes.
        self._requests = os.open(os.path.join(self.path, agent.REQUESTS), os.O_RDWR | os.O_NONBLOCK)
        self._pending = b""
        self._reading = threading.Lock()

    @property
    def env(self) -> Dict[str, str]:
        """The variables that mpirun passes on to its agents."""
        return {agent.CHANNEL_ENV: self.path}

    @property
    def mpi_args(self) -> List[str]:
        """The mpirun arguments that start each host's daemon through this channel's agent."""
        # mpirun starts every daemon itself: a daemon that started others (a tree spawn) would
        # need this channel where it runs. coll/han takes two "hosts" of one machine for one
        # node, and hangs in the first collective.
        return ["--prtemca", "plm_ssh_agent", self.agent_script, "--prtemca", "plm_ssh_no_tree_spawn", "1",
                "--mca", "coll", "^han"]

    def next_request(self, timeout: Optional[float] = None) -> Optional[DaemonRequest]:
        """The next agent's request; None when `timeout` seconds pass first, or once `close`
        has been called (from any thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reading:
            line = self._next_line(deadline) if self._requests is not None else None
        return _read_request(line) if line else None

    def answer(self, request: DaemonRequest, status: int) -> None:
        """End `request`'s agent with exit status `status`; nothing when that agent is gone."""
        reply = _open_for_writing(request.reply, _ANSWER_PATIENCE_S)
        if reply is not None:
            with os.fdopen(reply, "w") as file:
                file.write(f"{status}\n")

    def close(self) -> None:
        """Wake a reader waiting in `next_request` and remove the folder."""
        if self._requests is None:
            return
        os.write(self._requests, b"\n")
        with self._reading:
            os.close(self._requests)
            self._requests = None
        shutil.rmtree(self.path, ignore_errors=True)

    def _next_line(self, deadline: Optional[float]) -> Optional[str]:
        """The next line from the requests pipe (without its end), or None at `deadline`."""
        while b"\n" not in self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._requests], [], [], left)[0]:
                return None
            self._pending += os.read(self._requests, 4096)
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode().strip()


def _read_request(path: str) -> DaemonRequest:
    with open(path) as file:
        request = json.load(file)
    os.unlink(path)
    return DaemonRequest(host=request["host"], command=request["command"], reply=request["reply"])


def _open_for_writing(fifo: str, patience_s: float) -> Optional[int]:
    """A write end of `fifo` once its reader has it open; None when none does within
    `patience_s` (a blocking open would wait forever for an agent that is gone)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno != errno.ENXIO or time.monotonic() > deadline:
                return None
        time.sleep(0.02)


def _die_with_parent() -> None:
    """In a child: end with SIGKILL when the parent ends (ray.kill SIGKILLs an actor, Spark
    kills a task's worker; either would leave its daemon and ranks running)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_daemon(command: str, host: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start mpirun's daemon `command` (a shell command line) in this process, for `host`.

    The daemon and the processes it starts inherit this process's environment, `env` and
    HVDPLUS_NODE_ID=`host`: hvdplus then counts each worker as a node of its own, since Open
    MPI, which takes each for a host, cannot share memory between them (its split of the job
    by shared memory waits forever there).

    Args:
        command: the daemon's command line, for /bin/sh.
        host: the name of the host the daemon stands for.
        env: more variables for the daemon and its ranks.
    """
    daemon_env = dict(os.environ, **(env or {}), HVDPLUS_NODE_ID=host)
    return subprocess.Popen(["/bin/sh", "-c", command], env=daemon_env, preexec_fn=_die_with_parent)
