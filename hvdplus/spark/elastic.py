"""`hvdplus.spark.run_elastic(fn, num_proc=2, min_num_proc=1)`: an elastic hvdplus job whose ranks
run inside Spark tasks, which may come and go while it trains.

    results = hvdplus.spark.run_elastic(train, num_proc=2, min_num_proc=1, max_num_proc=4)

`fn` trains with hvdplus's elastic API (`hvd.elastic.run` and a state that commits). The
driver runs hvdplusrun's elastic launcher; the stage's tasks are ordinary (not barrier) tasks,
`max_num_proc` of them, so Spark starts those it has slots for, retries a task that fails and
starts waiting ones when slots free up. Each started task connects to the driver's task board
(a TCP port of the driver: the task and the board prove the job's key to each other before a
command is read, and every message after is sealed; see hvdplus.common.secure_channel), names its host, and runs
the daemons that mpirun asks for on that host, through hvdplus's launch agent. The launcher's
host discovery reads the connected tasks:
- a rank's process that dies while its task lives: the job re-forms in place (ULFM);
- a task that dies takes its daemon with it, which to Open MPI is a lost host: the launcher
  restarts the job on the tasks left, from the last commit, and grows it back onto the task
  that Spark starts in its place (a new attempt is a new host).
A barrier stage cannot do this: Spark ends every task of one when one fails.
"""

import json
import os
import secrets
import shlex
import shutil
import socket
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..common.keyed_handshake import HandshakeRoles, serve_connections, stop_listening
from ..common.secure_channel import SecureSession, accept_session, handshake_deadline, open_session
from ..runner.agent_channel import AgentChannel, DaemonRequest, start_daemon
from ..runner.python_function import launcher_flags, run_with_launcher
from .runner import DEFAULT_START_TIMEOUT_S

__all__ = ["run_elastic"]

_POLL_S = 0.1
_LOST = 255  # an agent's status for a host that is gone, as ssh's for a lost connection
_END_WAIT_S = 30.0
# How long the job waits for the rest of its first `num_proc` tasks once it has `min_num_proc`.
_GATHER_S = 5.0
_ROLES = HandshakeRoles(server=b"hvdplus spark board", client=b"hvdplus spark task")
_NAME = "the task board of hvdplus.spark.run_elastic"
# A task that has not ended its handshake within this long is dropped, however it trickles.
_HANDSHAKE_S = 5.0
# The longest message either side sends: a host's name and status, or a daemon's command line.
_MESSAGE_BYTES = 1 << 20


def run_elastic(fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None,
                num_proc: Optional[int] = None, min_num_proc: Optional[int] = None,
                max_num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
                elastic_timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                env: Optional[Dict[str, str]] = None, stdout=None, stderr=None, verbose: int = 1,
                **launcher_options) -> List[Any]:
    """Run `fn(*args, **kwargs)` as an elastic job on ranks in Spark tasks; return the return
    values of the ranks of its last run, in rank order.

    Args:
        fn: what each rank calls; it trains through `hvd.elastic.run`.
        args: the positional arguments of `fn`.
        kwargs: its keyword arguments.
        num_proc: the ranks to start with; Spark's default parallelism when not given.
        min_num_proc: the fewest ranks the job goes on with (`num_proc` when not given).
        max_num_proc: the most ranks it grows to, and the tasks of the stage (`num_proc` when
            not given).
        start_timeout: seconds for Spark to start `min_num_proc` tasks (600 when not given);
            past them the Spark job is cancelled and the call raises TimeoutError. The job
            starts once `num_proc` tasks have started, or `min_num_proc` and 5 s have passed.
        elastic_timeout: seconds the launcher waits for `min_num_proc` slots after a loss
            (hvdplusrun's --elastic-timeout).
        reset_limit: times the job may be started again after ranks died (--max-restarts).
        env: variables for the ranks.
        stdout: unused: the ranks' output goes to the driver's, tagged by rank. Accepted for
            Horovod's signature.
        stderr: unused, as `stdout`.
        verbose: 2 or more prints the mpirun command line.
        launcher_options: any other hvdplusrun option, as for `hvdplus.run`.

    Spark retries a failed task only when it may (`spark.task.maxFailures`; `local[N,F]` under a
    local master): without retries, one lost task fails the Spark job, and the job goes on
    with the tasks left only.

    Raises:
        RanksRaisedError: ranks raised; it names every one, with its exception and traceback.
        TimeoutError: Spark did not start `min_num_proc` tasks within `start_timeout`.
        RuntimeError: the job failed otherwise; its message says how.
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("hvdplus.spark.run_elastic needs an active Spark context "
                           "(SparkSession.builder.getOrCreate())")
    num_proc = num_proc or context.defaultParallelism
    min_np, max_np = min_num_proc or num_proc, max(max_num_proc or num_proc, num_proc)
    job = uuid.uuid4().hex[:8]
    board = _TaskBoard(context.getConf().get("spark.driver.host", socket.gethostname()))
    channel = AgentChannel()
    serving = threading.Thread(target=_serve_agents, args=(channel, board), name="hvdplus-spark-agents", daemon=True)
    serving.start()
    group = f"hvdplus-spark-elastic-{job}"
    task = _ElasticTask(board.address, board.key, f"hvdplus-spark-{job}", dict(env or {}))
    spark_job = threading.Thread(target=_run_tasks, args=(context, group, max_np, task, board),
                                 name="hvdplus-spark-elastic-job", daemon=True)
    spark_job.start()
    try:
        _wait_for_hosts(context, group, board, num_proc, min_np, DEFAULT_START_TIMEOUT_S if start_timeout is None
                        else float(start_timeout))
        flags = ["--num-proc", str(num_proc), "--min-np", str(min_np), "--max-np", str(max_np),
                 "--host-discovery-script", board.discovery_script, "--mpi-args", shlex.join(channel.mpi_args)]
        if elastic_timeout is not None:
            flags += ["--elastic-timeout", str(elastic_timeout)]
        if reset_limit is not None:
            flags += ["--max-restarts", str(reset_limit)]
        if verbose and verbose >= 2:
            flags.append("--verbose")
        return run_with_launcher(fn, args, kwargs, flags + launcher_flags(launcher_options),
                                 {**(env or {}), **channel.env})
    finally:
        board.close()
        channel.close()
        spark_job.join(timeout=_END_WAIT_S)
        if spark_job.is_alive():
            context.cancelJobGroup(group)


def _run_tasks(context, group: str, tasks: int, task, board) -> None:
    context.setJobGroup(group, f"hvdplus.spark.run_elastic: up to {tasks} ranks", interruptOnCancel=True)
    try:
        context.parallelize(range(tasks), tasks).mapPartitions(task).collect()
    except Exception as error:  # noqa: BLE001 - the job goes on with the tasks it has; said at the end
        board.spark_error = error


def _wait_for_hosts(context, group: str, board, num_proc: int, min_np: int, timeout: float) -> None:
    """Return once `num_proc` tasks have connected, or `min_np` have and the others have not
    within _GATHER_S more; past `timeout` with fewer, cancel the Spark job and raise."""
    deadline = time.monotonic() + timeout
    enough_since = None
    while len(board.hosts()) < num_proc:
        if len(board.hosts()) >= min_np:
            enough_since = enough_since or time.monotonic()
            if time.monotonic() - enough_since > _GATHER_S:
                return
            time.sleep(_POLL_S)
            continue
        if board.spark_error is not None:
            raise RuntimeError(f"hvdplus.spark.run_elastic: the Spark job failed: {board.spark_error}")
        if time.monotonic() > deadline:
            context.cancelJobGroup(group)
            raise TimeoutError(
                f"hvdplus.spark.run_elastic: Spark started {len(board.hosts())} of the {min_np} tasks the job "
                f"needs (min_num_proc) within {timeout:g} s; it has {context.defaultParallelism} slots "
                f"(default parallelism)")
        time.sleep(_POLL_S)


def _serve_agents(channel: AgentChannel, board) -> None:
    """Hand each launch agent's daemon command to its host's task, until the channel closes."""
    while (request := channel.next_request()) is not None:
        threading.Thread(target=_answer, args=(channel, board, request), daemon=True).start()


def _answer(channel: AgentChannel, board, request: DaemonRequest) -> None:
    channel.answer(request, board.run_daemon(request.host, request.command))


class _TaskBoard:
    """The driver's end of the job's tasks: each task connects, names its host, and runs the
    daemons it is sent, one at a time, answering each with its exit status. The board lists the
    connected hosts in a file that the launcher's host discovery reads."""

    def __init__(self, bind_host: str):
        self.key = secrets.token_bytes(32)
        self.spark_error: Optional[BaseException] = None
        self._folder = tempfile.mkdtemp(prefix="hvdplus-spark-board-")
        self._hosts_file = os.path.join(self._folder, "hosts")
        self.discovery_script = os.path.join(self._folder, "discover")
        with open(self.discovery_script, "w") as file:
            file.write(f"#!/bin/sh\ncat {shlex.quote(self._hosts_file)}\n")
        os.chmod(self.discovery_script, 0o755)
        self._tasks: Dict[str, "_TaskLink"] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._write_hosts()
        self._server = socket.create_server((bind_host, 0), backlog=64)
        self.address = (bind_host, self._server.getsockname()[1])
        threading.Thread(target=serve_connections, args=(self._server, self._admit, "hvdplus-spark-board-task"),
                         name="hvdplus-spark-board", daemon=True).start()

    def hosts(self) -> List[str]:
        with self._lock:
            return list(self._tasks)

    def run_daemon(self, host: str, command: str) -> int:
        """Run `command` in `host`'s task; its exit status, or 255 when the task is gone."""
        with self._lock:
            link = self._tasks.get(host)
        return _LOST if link is None else link.run(command)

    def close(self) -> None:
        """Tell every task the job has ended, and take no more."""
        self._closed = True
        stop_listening(self._server)
        with self._lock:
            links, self._tasks = list(self._tasks.values()), {}
        for link in links:
            link.end()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _admit(self, connection: socket.socket, proved: Callable[[], None]) -> None:
        try:
            try:
                session = accept_session(connection, self.key, _ROLES, _NAME, handshake_deadline(_HANDSHAKE_S))
            finally:
                proved()
            if session is None:
                connection.close()  # not one of the job's tasks: it gets nothing
                return
            connection.settimeout(_HANDSHAKE_S)
            link = _TaskLink(session)
            hello = link.receive()
            connection.settimeout(None)
        except OSError:
            connection.close()
            return
        if not hello or not isinstance(hello.get("host"), str) or self._closed:
            link.end()
            return
        with self._lock:
            self._tasks[hello["host"]] = link
        self._write_hosts()
        link.wait_until_gone()
        with self._lock:
            if self._tasks.get(hello["host"]) is link:
                del self._tasks[hello["host"]]
        if not self._closed:
            self._write_hosts()

    def _write_hosts(self) -> None:
        # Under the lock, file and all: tasks admitted together would otherwise share the
        # temporary file, and the one that renamed second would fail, leaving its task's
        # departure unwatched and the host listed for good.
        with self._lock:
            lines = "".join(f"{host}:1\n" for host in self._tasks)
            try:
                with open(self._hosts_file + ".tmp", "w") as file:
                    file.write(lines)
                os.replace(self._hosts_file + ".tmp", self._hosts_file)
            except FileNotFoundError:
                if not self._closed:
                    raise
                # close() has removed the folder: the job is over, nobody reads the list.


class _TaskLink:
    """One task's session: sealed JSON messages each way."""

    def __init__(self, session: SecureSession):
        self._session = session
        self._connection = session.connection
        self._running = threading.Lock()
        self._sending = threading.Lock()
        self._status: Optional[int] = None
        self._gone = threading.Event()

    def receive(self) -> Optional[Dict[str, Any]]:
        """The task's next message; None when it is gone or sent what is no message of the board's."""
        try:
            message = json.loads(self._session.receive(limit=_MESSAGE_BYTES))
        except (OSError, ValueError):
            return None
        return message if isinstance(message, dict) else None

    def send(self, message: Dict[str, Any]) -> None:
        with self._sending:
            self._session.send(json.dumps(message).encode())

    def run(self, command: str) -> int:
        with self._running:
            try:
                self.send({"command": command})
            except OSError:
                return _LOST
            reply = self.receive()
            if reply is None or not isinstance(reply.get("status"), int):
                self._gone.set()
                return _LOST
            return reply["status"]

    def wait_until_gone(self) -> None:
        """Return once the task has hung up (it died, or the job ended)."""
        while not self._gone.wait(timeout=1.0):
            with self._running:
                if self._gone.is_set():
                    return
                self._connection.settimeout(0.0)
                try:
                    if self._connection.recv(1, socket.MSG_PEEK) == b"":
                        self._gone.set()
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._gone.set()
                finally:
                    self._connection.settimeout(None)

    def end(self) -> None:
        try:
            self.send({"end": True})
        except OSError:
            pass
        self._gone.set()
        self._connection.close()


class _ElasticTask:
    """What each task of the stage runs: connect to the driver's board, then run the daemons
    it sends until the job ends."""

    def __init__(self, address, key: bytes, prefix: str, env: Dict[str, str]):
        self.address, self.key, self.prefix, self.env = tuple(address), key, prefix, env

    def __call__(self, _partition):
        from pyspark import TaskContext

        task = TaskContext.get()
        # A new attempt of a failed task is a new host to the launcher.
        host = f"{self.prefix}-{task.partitionId()}-{task.attemptNumber()}"
        try:
            session = join_board(self.address, self.key, host)
        except OSError:
            yield host  # the job ended before this task started
            return
        with session.connection:
            while True:
                # Read only from a board that proved the key: a command is run as it comes.
                message = json.loads(session.receive(limit=_MESSAGE_BYTES))
                if not isinstance(message, dict) or not isinstance(message.get("command"), str):
                    break
                status = start_daemon(message["command"], host, self.env).wait()
                session.send(json.dumps({"status": status}).encode())
        yield host


def join_board(address, key: bytes, host: str) -> SecureSession:
    """A task's session with the board at `address`, each side's proof of `key` given, its host
    `host` named; ConnectionError when the board there does not hold the key."""
    connection = socket.create_connection(tuple(address), timeout=_HANDSHAKE_S)
    try:
        session = open_session(connection, key, _ROLES, _NAME, handshake_deadline(_HANDSHAKE_S))
        connection.settimeout(None)
        session.send(json.dumps({"host": host}).encode())
        return session
    except BaseException:
        connection.close()
        raise
