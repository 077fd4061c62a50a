"""`HvdplusConfig`: a Ray Train backend whose workers are the ranks of one hvdplus job.

    from ray.train import ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from hvdplus.ray import HvdplusConfig

    def train_loop(config):
        import hvdplus.torch as hvd
        hvd.init()                  # rank ray.train.get_context().get_world_rank() of the job
        ...
        ray.train.report(metrics, checkpoint=checkpoint)

    trainer = DataParallelTrainer(train_loop, backend_config=HvdplusConfig(),
                                  scaling_config=ScalingConfig(num_workers=4))
    result = trainer.fit()

Ray Train places the workers and runs the training function in them; the backend makes those
very processes the ranks of one MPI job, since `ray.train.report` works only there. Before the
training function starts, the controller starts mpirun with one fake host per worker and a
launch agent in place of ssh (hvdplus.runner.agent_channel): each host's daemon runs inside its worker,
and starts a placeholder rank (hvdplus.ray.placeholder) that hands the worker the variables
that make a process that rank. `hvd.init()` in the training function then joins the job as
the placeholder's rank. When the training function returns, the worker finalizes MPI and
lets its placeholder end; when it raises, MPI is left as it is (the other ranks may wait in
a collective, where finalizing would wait with them) and Ray Train reports the rank's error.
"""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Sequence

import ray
from ray.train.backend import Backend, BackendConfig

from ..runner.command import Job, OpenMpi
from ..runner.errors import LaunchError
from ..runner.hosts import Host
from ..runner.launch import find_mpi
from ..runner.agent_channel import AgentChannel, DaemonRequest, start_daemon
from .placeholder import DONE_FILE, ENVIRONMENT_FILE, OWNER_ENV, PROXY_DIR_ENV

__all__ = ["HvdplusConfig", "HvdplusBackend"]

_POLL_INTERVAL_S = 0.5
_MPIRUN_GRACE_S = 1.0
_LOG_TAIL_CHARS = 3000
# The daemons this worker started, held so that they are reaped rather than warned about.
_daemons: List[subprocess.Popen] = []


@dataclasses.dataclass
class HvdplusConfig(BackendConfig):
    """The hvdplus backend of a Ray Train trainer: its workers form one MPI job.

    Args:
        timeout_s: seconds the workers have to form the MPI job before training starts;
            past them the run fails with a TimeoutError that shows mpirun's output.
        env: variables for the ranks (the training workers) and mpirun's daemons, e.g.
            hvdplus settings (`{"HVDPLUS_FUSION_THRESHOLD_MB": "32"}`) or Open MPI's
            (`{"OMPI_MCA_btl_tcp_if_include": "eth0"}`).
        mpi_args: extra mpirun arguments, after hvdplus' own.
    """

    timeout_s: float = 60.0
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    mpi_args: Sequence[str] = ()

    @property
    def backend_cls(self):
        return HvdplusBackend

    @property
    def train_func_context(self):
        return rank_of_the_job

    def to_dict(self) -> Dict[str, Any]:
        # The values of `env` may be secrets: only their names leave the config.
        return {"timeout_s": self.timeout_s, "env": sorted(self.env), "mpi_args": list(self.mpi_args)}


class HvdplusBackend(Backend):
    """Forms the MPI job of a worker group when it starts, and ends it at its shutdown.

    Ray Train keeps one instance of a backend per process, so the jobs are held by group."""

    def __init__(self):
        self._jobs: Dict[int, ProxyJob] = {}

    def on_start(self, worker_group, backend_config: HvdplusConfig) -> None:
        job = ProxyJob(len(worker_group), backend_config)
        try:
            job.form(worker_group)
        except BaseException:
            job.close()
            raise
        self._jobs[id(worker_group)] = job

    def on_shutdown(self, worker_group, backend_config: HvdplusConfig) -> None:
        job = self._jobs.pop(id(worker_group), None)
        if job is not None:
            job.close()


class ProxyJob:
    """One mpirun, in the controller, whose ranks are the workers of one group.

    Args:
        num_workers: the workers in the group, one rank each.
        config: the backend's settings.
    """

    def __init__(self, num_workers: int, config: HvdplusConfig):
        self.config = config
        job = uuid.uuid4().hex[:8]
        self.hosts = [f"hvdplus-train-{job}-{index}" for index in range(num_workers)]
        self.channel = AgentChannel()
        self.agents: List[DaemonRequest] = []
        self.log_path = os.path.join(self.channel.path, "mpirun.log")
        self.deadline = time.monotonic() + config.timeout_s
        try:
            self.mpirun = self._start_mpirun()
        except BaseException:
            self.channel.close()
            raise

    def form(self, group) -> None:
        """Start each host's daemon in its worker, then make each worker its rank."""
        starts = [self._start_daemon(group, self._next_request()) for _ in self.hosts]
        for request, reference in starts:
            self._check_daemon_started(request, reference)
        ranks = self._wait(group.execute_async(adopt_rank_environment, self._seconds_left(), self.config.env),
                           "the placeholder ranks to start")
        if ranks != list(range(len(self.hosts))):
            raise LaunchError(f"hvdplus: the workers in Ray Train's rank order got MPI ranks {ranks}; "
                              f"expected {list(range(len(self.hosts)))}")

    def close(self) -> None:
        """End the agents, then mpirun (at once when it outlives a short grace), and remove
        the channel. Never waits longer than a few seconds."""
        for request in self.agents:
            self.channel.answer(request, 0)
        self.agents = []
        _stop(self.mpirun, _MPIRUN_GRACE_S)
        self.channel.close()

    def _start_mpirun(self) -> subprocess.Popen:
        with open(self.log_path, "w") as log:
            return subprocess.Popen(
                mpirun_command(self.hosts, self.channel.mpi_args, self.config.mpi_args),
                env=dict(os.environ, **self.config.env, **self.channel.env),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _next_request(self) -> DaemonRequest:
        while True:
            self._check_mpirun_running("its daemons started")
            request = self.channel.next_request(timeout=min(_POLL_INTERVAL_S, self._seconds_left()))
            if request is not None:
                return request
            if self._seconds_left() <= 0:
                raise TimeoutError(self._describe(f"mpirun asked for {len(self.agents)} of its {len(self.hosts)} "
                                                  f"daemons within {self.config.timeout_s:g} s"))

    def _start_daemon(self, group, request: DaemonRequest):
        worker = self.hosts.index(request.host)
        self.agents.append(request)
        return request, group.execute_single_async(worker, start_daemon_in_worker, request.command, request.host,
                                                   self.config.env)

    def _check_daemon_started(self, request: DaemonRequest, reference) -> None:
        try:
            self._wait([reference], f"worker {self.hosts.index(request.host)} to start its daemon")
        except BaseException:
            self.agents.remove(request)
            self.channel.answer(request, 255)
            raise

    def _wait(self, references: list, what: str) -> list:
        """The values of `references`, waiting for them while mpirun runs and time is left."""
        pending = list(references)
        while pending:
            self._check_mpirun_running(what)
            if self._seconds_left() <= 0:
                raise TimeoutError(self._describe(f"timed out after {self.config.timeout_s:g} s waiting for {what}"))
            _, pending = ray.wait(pending, num_returns=len(pending),
                                  timeout=min(_POLL_INTERVAL_S, self._seconds_left()))
        return ray.get(list(references))

    def _check_mpirun_running(self, what: str) -> None:
        status = self.mpirun.poll()
        if status is not None:
            raise LaunchError(self._describe(f"mpirun ended with status {status} before {what}"))

    def _seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _describe(self, problem: str) -> str:
        """`problem`, with the end of mpirun's output."""
        with open(self.log_path, errors="replace") as log:
            output = log.read()[-_LOG_TAIL_CHARS:].rstrip()
        return f"hvdplus could not form the MPI job of {len(self.hosts)} Ray Train workers: {problem}; " \
               f"mpirun's output: {output or '(none)'}"


def mpirun_command(hosts: Sequence[str], agent_args: Sequence[str], mpi_args: Sequence[str]) -> List[str]:
    """mpirun's command line for one placeholder rank on each of `hosts`, whose daemons start
    through the agent that `agent_args` name (AgentChannel.mpi_args), then `mpi_args`."""
    mpirun, dialect = find_mpi()
    if not isinstance(dialect, OpenMpi) or dialect.version < (5,):
        raise LaunchError(f"hvdplus on Ray Train needs Open MPI 5's mpirun, found {mpirun}")
    job = Job(
        num_proc=len(hosts),
        program=[sys.executable, "-m", "hvdplus.ray.placeholder"],
        hosts=[Host(name, 1) for name in hosts],
        oversubscribe=True,
        as_root=os.geteuid() == 0,
        mpi_args=[*agent_args, *mpi_args],
    )
    return dialect.command(mpirun, job)


def _stop(process: subprocess.Popen, grace_s: float) -> None:
    """Let `process` end within `grace_s`, else terminate it, else kill it."""
    for end in (lambda: None, process.terminate, process.kill):
        end()
        try:
            process.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


# -- in the workers -------------------------------------------------------------------------

def start_daemon_in_worker(command: str, host: str, env: Dict[str, str]) -> None:
    """Start mpirun's daemon for `host` in this worker, with a folder for its placeholder
    rank; returns at once (the worker's main thread answers Ray Train's polls)."""
    os.environ[PROXY_DIR_ENV] = tempfile.mkdtemp(prefix="hvdplus-rank-")
    os.environ[OWNER_ENV] = str(os.getpid())
    _daemons.append(start_daemon(command, host, env))


def adopt_rank_environment(timeout_s: float, env: Dict[str, str]) -> int:
    """Take over the placeholder's rank: its variables, then `env`, into this worker's
    environment; returns the rank."""
    if "mpi4py.MPI" in sys.modules:
        raise LaunchError("hvdplus: this Ray Train worker loaded mpi4py.MPI before the job formed, which made "
                          "it an MPI process of its own; import mpi4py or hvdplus' collectives only inside "
                          "the training function")
    variables = _read_when_written(os.path.join(os.environ[PROXY_DIR_ENV], ENVIRONMENT_FILE), timeout_s)
    os.environ.update(env)
    os.environ.update(variables)
    return int(variables["PMIX_RANK"])


def _read_when_written(path: str, timeout_s: float) -> Dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"hvdplus: the placeholder rank of this worker wrote no {path} within "
                               f"{timeout_s:g} s")
        time.sleep(0.02)
    with open(path) as file:
        return json.load(file)


@contextlib.contextmanager
def rank_of_the_job():
    """Around the training function, in its thread: once it returns, stop hvdplus, finalize
    MPI and let the placeholder end. An exception passes through untouched: the other
    ranks may wait in a collective for this one, and finalizing would wait with them."""
    yield
    _finalize_mpi()
    _release_placeholder()


def _finalize_mpi() -> None:
    # Found among the loaded modules, not imported: a training function that never loaded
    # them started no MPI, and the backend itself never becomes an MPI process.
    runtime = sys.modules.get("hvdplus.core.runtime")
    if runtime is not None:
        runtime.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def _release_placeholder() -> None:
    folder = os.environ.get(PROXY_DIR_ENV)
    if folder and os.path.isdir(folder):
        open(os.path.join(folder, DONE_FILE), "w").close()
