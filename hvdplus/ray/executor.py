"""`RayExecutor`: the ranks of an hvdplus job in Ray actors, placed by Ray.

    import ray
    from hvdplus.ray import RayExecutor

    ray.init()
    executor = RayExecutor(num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, args=(0.1,))    # each rank's return value, in rank order
    executor.shutdown()

Each worker is an actor that stands for one "host" of one slot, under a name of its own that
resolves to no machine. `run` starts the job with mpirun from the driver, whose launch agent
(hvdplus.runner.launch_agent) hands each host's daemon command to its actor: the daemon runs inside the
actor, and the rank inside the daemon. So the ranks form one MPI job, and every hvdplus
collective, algorithm and adapter works as under hvdplusrun.
"""

import asyncio
import itertools
import os
import shlex
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..runner.python_function import run_with_launcher
from ..runner.agent_channel import AgentChannel, DaemonRequest, start_daemon

__all__ = ["RayExecutor"]


@ray.remote
class _Host:
    """One worker: the host that mpirun's daemon for it, and the rank, run on."""

    def __init__(self, env: Dict[str, str]):
        os.environ.update(env)

    def run_daemon(self, command: str, host: str) -> int:
        """Run mpirun's daemon `command` (a shell command line) for `host` to its end; its status."""
        return start_daemon(command, host).wait()

    def execute(self, fn: Callable, worker: Any) -> Any:
        return fn(worker)

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()


class RayExecutor:
    """An hvdplus job on `num_workers` Ray actors.

    Args:
        num_workers: the number of ranks, one actor each.
        cpus_per_worker: CPUs Ray reserves for each actor.
        use_gpu: reserve a GPU for each actor (`gpus_per_worker` of them).
        gpus_per_worker: GPUs for each actor when `use_gpu`.
        env: variables for the actors and the ranks.
        placement_strategy: Ray's placement strategy for the workers' bundles: "PACK" (as few
            nodes as can hold them) or "SPREAD".
        start_timeout: seconds `start` waits for Ray to place every worker.
        min_workers: makes the job elastic (its function uses `hvdplus.elastic.run`): it goes on
            while at least this many workers live. A worker whose actor dies is a lost host to
            the job, which restarts from its last commit on the workers left, and grows back
            once Ray has placed a new actor in the dead one's place.
        max_restarts: how many times an elastic job restarts before it fails.
    """

    def __init__(self, num_workers: int, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, env: Optional[Dict[str, str]] = None,
                 placement_strategy: str = "PACK", start_timeout: float = 30.0,
                 min_workers: Optional[int] = None, max_restarts: int = 3):
        if min_workers is not None and not 1 <= min_workers <= num_workers:
            raise ValueError(f"RayExecutor: min_workers={min_workers} must lie in 1..num_workers={num_workers}")
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.env = dict(env or {})
        self.placement_strategy = placement_strategy
        self.start_timeout = start_timeout
        self.min_workers = min_workers
        self.max_restarts = max_restarts
        self._hosts: Dict[str, Any] = {}  # the live workers' actors by host name, in rank order
        self._bundles: Dict[str, int] = {}
        self._numbers = itertools.count()
        self._job = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._running = threading.Lock()
        self._group = None
        self._channel: Optional[AgentChannel] = None
        self._listener: Optional[threading.Thread] = None
        self._mailboxes: List[Any] = []

    # -- Horovod's RayExecutor API ----------------------------------------------------------
    def start(self) -> None:
        """Place the workers (all or none, within `start_timeout`) and start their actors."""
        self._group = placement_group([self._bundle()] * self.num_workers, strategy=self.placement_strategy)
        ready, _ = ray.wait([self._group.ready()], timeout=self.start_timeout)
        if not ready:
            available = ray.available_resources()
            self.shutdown()
            raise TimeoutError(
                f"RayExecutor: Ray could not place {self.num_workers} workers of {self._bundle()} within "
                f"{self.start_timeout:.0f} s; the cluster has {available.get('CPU', 0):g} CPUs and "
                f"{available.get('GPU', 0):g} GPUs free")
        self._channel = AgentChannel()
        _write_script(self._path("discover"), f"cat {self._path('hosts')}")
        actors = [self._add_host(bundle) for bundle in range(self.num_workers)]
        ray.get([actor.node_ip.remote() for actor in actors])
        self._write_hosts()
        self._listener = threading.Thread(target=self._serve_agents, name="hvdplus-ray-agents", daemon=True)
        self._listener.start()

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Call `fn(*args, **kwargs)` on every rank; return the ranks' return values in rank order."""
        if not self._hosts:
            raise RuntimeError("RayExecutor.run before start()")
        if not self._running.acquire(blocking=False):
            raise RuntimeError("RayExecutor runs one job at a time: another run is in progress")
        try:
            return run_with_launcher(fn, args, kwargs, self._launcher_flags(), {**self.env, **self._channel.env})
        finally:
            self._running.release()

    def run_remote(self, fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Start `run(fn, args, kwargs)` and return at once: one Ray object reference per rank,
        each ready when the job ends, with that rank's return value (`ray.get` raises the job's
        error)."""
        if not self._hosts:
            raise RuntimeError("RayExecutor.run_remote before start()")
        mailbox = _Results.remote()
        self._mailboxes.append(mailbox)
        references = [mailbox.result.remote(rank) for rank in range(self.num_workers)]

        def run_and_post():
            try:
                results, error = self.run(fn, args, kwargs), None
            except BaseException as raised:  # noqa: BLE001 - handed to whoever gets a reference
                results, error = None, raised
            ray.get(mailbox.post.remote(results, error))

        threading.Thread(target=run_and_post, name="hvdplus-ray-run-remote", daemon=True).start()
        return references

    @property
    def workers(self) -> List[Any]:
        """The live workers' actors, in rank order."""
        with self._lock:
            return list(self._hosts.values())

    def execute(self, fn: Callable[[Any], Any]) -> List[Any]:
        """`fn(worker)` on each worker's actor, outside MPI; the results in worker order."""
        return ray.get([actor.execute.remote(fn, index) for index, actor in enumerate(self.workers)])

    def shutdown(self) -> None:
        with self._lock:
            actors, self._hosts = list(self._hosts.values()), {}
        for actor in actors + self._mailboxes:
            ray.kill(actor)
        self._mailboxes = []
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None
        if self._channel is not None:
            self._channel.close()  # which ends the listener
            self._channel = None

    # -- the workers -----------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self._channel.path, name)

    def _bundle(self) -> Dict[str, float]:
        return {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}

    def _launcher_flags(self) -> List[str]:
        flags = ["--num-proc", str(self.num_workers), "--mpi-args", shlex.join(self._channel.mpi_args)]
        if self.min_workers is None:
            with self._lock:
                return flags + ["--hosts", ",".join(f"{name}:1" for name in self._hosts)]
        # The launcher's host discovery reads the live workers, which _replace keeps current.
        return flags + ["--min-np", str(self.min_workers), "--max-np", str(self.num_workers),
                        "--max-restarts", str(self.max_restarts),
                        "--host-discovery-script", self._path("discover")]

    def _add_host(self, bundle: int) -> Any:
        """A new worker's actor in placement bundle `bundle`, under a host name never used before."""
        name = f"hvdplus-ray-{self._job}-{next(self._numbers)}"
        actor = _Host.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, bundle)
                              ).remote(self.env)
        with self._lock:
            self._hosts[name] = actor
            self._bundles[name] = bundle
        return actor

    def _write_hosts(self) -> None:
        with self._lock:
            lines = "".join(f"{name}:1\n" for name in self._hosts)
        path = self._path("hosts")
        with open(path + ".tmp", "w") as file:
            file.write(lines)
        os.replace(path + ".tmp", path)

    def _replace(self, name: str) -> None:
        """Put a new actor in the place of the dead worker `name`; list it for the launcher's
        discovery once Ray has placed it."""
        with self._lock:
            if self._hosts.pop(name, None) is None or self._channel is None:
                return  # shut down, or replaced already
            bundle = self._bundles.pop(name)
        self._write_hosts()
        actor = self._add_host(bundle)
        try:
            ray.get(actor.node_ip.remote())
        except Exception:  # noqa: BLE001 - shut down meanwhile: there is nothing to list
            return
        if self._channel is not None:
            self._write_hosts()

    # -- the launch agents' requests -----------------------------------------------------------
    def _serve_agents(self) -> None:
        """Hand each launch agent's daemon command to the actor of its host, until shutdown."""
        channel = self._channel
        while (request := channel.next_request()) is not None:
            with self._lock:
                actor = self._hosts.get(request.host)
            if actor is None:  # a worker that died since the launcher read the hosts
                channel.answer(request, 255)
                continue
            reference = actor.run_daemon.remote(request.command, request.host)
            threading.Thread(target=self._answer, args=(channel, reference, request), daemon=True).start()

    def _answer(self, channel: AgentChannel, reference, request: DaemonRequest) -> None:
        """Tell the agent how its daemon ended, as ssh would; replace the worker if its actor
        died with it (an elastic job then grows back onto the new one)."""
        try:
            status = ray.get(reference)
        except ray.exceptions.RayActorError:  # the actor died, and the daemon with it
            status = 255
            if self.min_workers is not None:
                threading.Thread(target=self._replace, args=(request.host,), daemon=True).start()
        except Exception:  # noqa: BLE001 - the daemon could not run: the agent fails as ssh would
            status = 255
        channel.answer(request, status)


@ray.remote(num_cpus=0)
class _Results:
    """Holds a job's per-rank results for `run_remote`'s references, which wait for them."""

    def __init__(self):
        self._posted = asyncio.Event()
        self._results: Optional[List[Any]] = None
        self._error: Optional[BaseException] = None

    async def post(self, results: Optional[List[Any]], error: Optional[BaseException]) -> None:
        self._results, self._error = results, error
        self._posted.set()

    async def result(self, rank: int) -> Any:
        await self._posted.wait()
        if self._error is not None:
            raise self._error
        return self._results[rank]


def _write_script(path: str, command: str) -> None:
    with open(path, "w") as file:
        file.write(f"#!/bin/sh\n{command}\n")
    os.chmod(path, 0o755)
