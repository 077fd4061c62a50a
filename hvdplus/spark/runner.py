"""`hvdplus.spark.run(fn, num_proc=4)`: the ranks of one MPI job inside the tasks of one Spark
barrier stage; each rank's return value comes back to the driver, in rank order.

    from pyspark.sql import SparkSession
    import hvdplus.spark

    spark = SparkSession.builder.getOrCreate()
    results = hvdplus.spark.run(train, args=(0.1,), num_proc=4)

Spark schedules the stage's tasks all at once or not at all (barrier execution). Each task
stands for one "host" of one slot, under a name that resolves to no machine. Task 0 starts the
job as `hvdplus.run` does (the launcher of hvdplusrun), with a launch agent in place of ssh
(hvdplus.runner.launch_agent): mpirun asks the agent for each host's daemon, and task 0 hands
each task its daemon's command through `BarrierTaskContext.allGather`, Spark's own channel
between the tasks, so no port of hvdplus's is opened. Each task runs its daemon, which starts
the rank inside the task. The ranks' results come back to task 0 in the launcher's messages,
and from it to the driver.
"""

import json
import shlex
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..runner.agent_channel import AgentChannel, start_daemon
from ..runner.python_function import launcher_flags, run_with_launcher

__all__ = ["run"]

# How long task 0 waits for mpirun to ask for every daemon, and the driver for every task to
# start, unless start_timeout says otherwise (Horovod's own default for spark.run).
DEFAULT_START_TIMEOUT_S = 600.0
_POLL_S = 0.1
_ERROR = "error"  # no host is named so


def run(fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
        start_timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None, stdout=None, stderr=None,
        verbose: int = 1, **launcher_options) -> List[Any]:
    """Run `fn(*args, **kwargs)` on `num_proc` ranks, each in a task of one Spark barrier stage;
    return the list of its return values, in rank order.

    Args:
        fn: what each rank calls; cloudpickled with its arguments, as for `hvdplus.run`. The
            ranks call `hvd.init()` themselves.
        args: the positional arguments of `fn`.
        kwargs: its keyword arguments.
        num_proc: the number of ranks, one Spark task each; the Spark context's default
            parallelism when not given.
        start_timeout: seconds for every task to start and the job to form (600 when not given);
            past them the Spark job is cancelled and the call raises TimeoutError.
        env: variables for the ranks.
        stdout: unused: the ranks' output goes to task 0's, tagged by rank (Spark's executor logs,
            the console under a local master). Accepted for Horovod's signature.
        stderr: unused, as `stdout`.
        verbose: 2 or more prints the mpirun command line.
        launcher_options: any other hvdplusrun option, as for `hvdplus.run`.

    Raises:
        RanksRaisedError: ranks raised; it names every one, with its exception and traceback.
        TimeoutError: Spark did not start `num_proc` tasks at once within `start_timeout`.
        RuntimeError: the job failed otherwise; its message says how.
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("hvdplus.spark.run needs an active Spark context (SparkSession.builder.getOrCreate())")
    num_proc = num_proc or context.defaultParallelism
    timeout = DEFAULT_START_TIMEOUT_S if start_timeout is None else float(start_timeout)
    job = uuid.uuid4().hex[:8]
    hosts = [f"hvdplus-spark-{job}-{index}" for index in range(num_proc)]
    flags = ["--num-proc", str(num_proc), "--hosts", ",".join(f"{host}:1" for host in hosts)]
    if verbose and verbose >= 2:
        flags.append("--verbose")
    task = _RankTask(fn, tuple(args), dict(kwargs or {}), hosts, flags, dict(env or {}), timeout,
                     launcher_options)
    group = f"hvdplus-spark-{job}"
    outcome: Dict[str, Any] = {}
    collecting = threading.Thread(target=_collect, args=(context, group, num_proc, task, outcome),
                                  name="hvdplus-spark-job", daemon=True)
    collecting.start()
    _wait_for_tasks(context, group, num_proc, timeout, collecting)
    collecting.join()
    if "error" in outcome:
        raise RuntimeError(f"hvdplus.spark.run: the Spark job failed: {outcome['error']}") from outcome["error"]
    returned = [value for value in outcome["values"] if value is not None]
    if len(returned) != 1:
        raise RuntimeError(f"hvdplus.spark.run: task 0 returned {len(returned)} results, expected one")
    kind, value = returned[0]
    if kind == "error":
        raise value
    return value


def _collect(context, group: str, num_proc: int, task, outcome: Dict[str, Any]) -> None:
    context.setJobGroup(group, f"hvdplus.spark.run: {num_proc} ranks", interruptOnCancel=True)
    try:
        rdd = context.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)
        outcome["values"] = rdd.collect()
    except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
        outcome["error"] = error


def _wait_for_tasks(context, group: str, num_proc: int, timeout: float, collecting: threading.Thread) -> None:
    """Return once the stage runs all its tasks (or the job ended); past `timeout`, cancel it
    and raise TimeoutError. Spark itself would retry a barrier stage that lacks slots for
    minutes before it fails."""
    deadline = time.monotonic() + timeout
    tracker = context.statusTracker()
    running = 0
    while collecting.is_alive():
        running = max([running] + [_running_tasks(tracker, job) for job in tracker.getJobIdsForGroup(group)])
        if running >= num_proc:
            return
        if time.monotonic() > deadline:
            context.cancelJobGroup(group)
            collecting.join(timeout=30)
            raise TimeoutError(
                f"hvdplus.spark.run: Spark started {running} of the {num_proc} tasks of the job's barrier stage "
                f"within {timeout:g} s; it runs all at once or none, and it has {context.defaultParallelism} "
                f"slots (default parallelism): ask for fewer ranks (num_proc) or give Spark more cores")
        time.sleep(_POLL_S)


def _running_tasks(tracker, job_id: int) -> int:
    job = tracker.getJobInfo(job_id)
    if job is None:
        return 0
    stages = [tracker.getStageInfo(stage) for stage in job.stageIds]
    return sum(stage.numActiveTasks + stage.numCompletedTasks for stage in stages if stage is not None)


class _RankTask:
    """What each task of the barrier stage runs (a callable, so that Spark ships it whole)."""

    def __init__(self, fn, args, kwargs, hosts, flags, env, timeout, launcher_options):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.hosts, self.flags, self.env = hosts, flags, env
        self.timeout, self.launcher_options = timeout, launcher_options

    def __call__(self, _partition):
        from pyspark import BarrierTaskContext

        barrier = BarrierTaskContext.get()
        index = barrier.partitionId()
        launch = _Launch(self) if index == 0 else None
        commands: Dict[str, str] = {}
        if launch is not None:
            try:
                commands = launch.daemon_commands()
            except BaseException as error:  # noqa: BLE001 - every task says it, below
                launch.abandon()
                commands = {_ERROR: f"{type(error).__name__}: {error}"}
        # Every task reaches allGather, task 0 even when it failed: the others would wait
        # there until Spark's barrier timeout otherwise.
        commands = json.loads(barrier.allGather(json.dumps(commands))[0])
        if _ERROR in commands:
            raise RuntimeError(f"hvdplus.spark.run: task 0 could not start the job: {commands[_ERROR]}")
        daemon = start_daemon(commands[self.hosts[index]], self.hosts[index], self.env)
        result = launch.result() if launch else None
        daemon.wait()
        yield result


class _Launch:
    """In task 0: the job's launcher, in a thread, and the agents that mpirun starts."""

    def __init__(self, task: _RankTask):
        self.task = task
        self.channel = AgentChannel()
        self.outcome: Dict[str, Any] = {}
        self.flags = task.flags + launcher_flags(task.launcher_options) + ["--mpi-args",
                                                                          shlex.join(self.channel.mpi_args)]
        self.thread = threading.Thread(target=self._launch, name="hvdplus-spark-launcher", daemon=True)
        self.thread.start()

    def _launch(self) -> None:
        try:
            self.outcome["value"] = ("value", run_with_launcher(self.task.fn, self.task.args, self.task.kwargs,
                                                                self.flags, {**self.task.env, **self.channel.env}))
        except BaseException as error:  # noqa: BLE001 - what the driver raises
            self.outcome["value"] = ("error", error)

    def daemon_commands(self) -> Dict[str, str]:
        """Each host's daemon command, once mpirun has asked for all. Each agent is answered at
        once: its daemon runs in another task, and mpirun learns of its end over its own
        connection to it, as with ssh sessions that end early."""
        commands: Dict[str, str] = {}
        deadline = time.monotonic() + self.task.timeout
        while len(commands) < len(self.task.hosts):
            if not self.thread.is_alive():
                raise RuntimeError(f"hvdplus.spark.run: the job ended before mpirun asked for its daemons: "
                                   f"{self.outcome.get('value')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"hvdplus.spark.run: mpirun asked for {len(commands)} of its "
                                   f"{len(self.task.hosts)} daemons within {self.task.timeout:g} s")
            request = self.channel.next_request(timeout=_POLL_S)
            if request is not None:
                commands[request.host] = request.command
                self.channel.answer(request, 0)
        return commands

    def abandon(self) -> None:
        """End the agents still waiting, as failed ssh sessions: mpirun then ends the launch."""
        while (request := self.channel.next_request(timeout=_POLL_S)) is not None:
            self.channel.answer(request, 255)
        self.thread.join(timeout=10)
        self.channel.close()

    def result(self):
        self.thread.join()
        self.channel.close()
        return self.outcome["value"]
