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
(hvdplus.ray.agent) hands each host's daemon command to its actor: the daemon runs inside the
actor, and the rank inside the daemon. So the ranks form one MPI job, and every hvdplus
collective, algorithm and adapter works as under hvdplusrun.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..runner.python_function import run_with_launcher
from . import agent

__all__ = ["RayExecutor"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a child of the actor: end with SIGKILL when the actor's process ends (ray.kill
    SIGKILLs an actor, and would leave its daemon and ranks running)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@ray.remote
class _Host:
    """One worker: the host that mpirun's daemon for it, and the rank, run on."""

    def __init__(self, env: Dict[str, str]):
        os.environ.update(env)

    def run_daemon(self, command: str, host: str) -> int:
        """Run mpirun's daemon `command` (a shell command line) to its end; its status. The
        ranks it starts inherit HVDPLUS_NODE_ID: hvdplus then counts each worker as a node of
        its own, since Open MPI, which takes each for a host, cannot share memory between them
        (its split of the job by shared memory waits forever there)."""
        env = dict(os.environ, HVDPLUS_NODE_ID=host)
        return subprocess.run(["/bin/sh", "-c", command], env=env, preexec_fn=_die_with_parent).returncode

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
    """

    def __init__(self, num_workers: int, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, env: Optional[Dict[str, str]] = None,
                 placement_strategy: str = "PACK", start_timeout: float = 30.0):
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.env = dict(env or {})
        self.placement_strategy = placement_strategy
        self.start_timeout = start_timeout
        self._hosts: List[Any] = []
        self._names: List[str] = []
        self._group = None
        self._channel: Optional[str] = None
        self._listener: Optional[threading.Thread] = None

    # -- Horovod's RayExecutor API ----------------------------------------------------------
    def start(self) -> None:
        """Place the workers (all or none, within `start_timeout`) and start their actors."""
        bundle = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}
        self._group = placement_group([bundle] * self.num_workers, strategy=self.placement_strategy)
        ready, _ = ray.wait([self._group.ready()], timeout=self.start_timeout)
        if not ready:
            available = ray.available_resources()
            self.shutdown()
            raise TimeoutError(
                f"RayExecutor: Ray could not place {self.num_workers} workers of {bundle} within "
                f"{self.start_timeout:.0f} s; the cluster has {available.get('CPU', 0):g} CPUs and "
                f"{available.get('GPU', 0):g} GPUs free")
        self._channel = tempfile.mkdtemp(prefix="hvdplus-ray-")
        os.mkfifo(os.path.join(self._channel, agent.REQUESTS))
        with open(os.path.join(self._channel, "agent"), "w") as file:
            file.write(f"#!/bin/sh\nexec {sys.executable} -m hvdplus.ray.agent \"$@\"\n")
        os.chmod(os.path.join(self._channel, "agent"), 0o755)
        job = uuid.uuid4().hex[:8]
        self._names = [f"hvdplus-ray-{job}-{index}" for index in range(self.num_workers)]
        self._hosts = [
            _Host.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, index)).remote(self.env)
            for index in range(self.num_workers)]
        ray.get([host.node_ip.remote() for host in self._hosts])
        self._listener = threading.Thread(target=self._serve_agents, name="hvdplus-ray-agents", daemon=True)
        self._listener.start()

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Call `fn(*args, **kwargs)` on every rank; return the ranks' return values in rank order."""
        if not self._hosts:
            raise RuntimeError("RayExecutor.run before start()")
        agent_script = os.path.join(self._channel, "agent")
        # coll/han takes two "hosts" on one machine for one node and hangs in the first collective.
        mpi_args = f"--prtemca plm_ssh_agent {agent_script} --mca coll ^han"
        flags = ["--num-proc", str(self.num_workers), "--hosts", ",".join(f"{name}:1" for name in self._names),
                 "--mpi-args", mpi_args]
        return run_with_launcher(fn, args, kwargs, flags, {**self.env, agent.CHANNEL_ENV: self._channel})

    def execute(self, fn: Callable[[Any], Any]) -> List[Any]:
        """`fn(worker)` on each worker's actor, outside MPI; the results in worker order."""
        return ray.get([host.execute.remote(fn, index) for index, host in enumerate(self._hosts)])

    def shutdown(self) -> None:
        for host in self._hosts:
            ray.kill(host)
        self._hosts = []
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None
        if self._channel is not None:
            # Wake the listener with an empty line, then remove the folder.
            with open(os.path.join(self._channel, agent.REQUESTS), "w") as requests:
                requests.write("\n")
            shutil.rmtree(self._channel, ignore_errors=True)
            self._channel = None

    # -- the launch agents' requests -----------------------------------------------------------
    def _serve_agents(self) -> None:
        """Hand each launch agent's daemon command to the actor of its host, until shutdown
        sends an empty line."""
        hosts = dict(zip(self._names, self._hosts))
        # Opened for writing too, so that the pipe never ends between two agents' writes.
        with os.fdopen(os.open(os.path.join(self._channel, agent.REQUESTS), os.O_RDWR)) as requests:
            for line in requests:
                path = line.strip()
                if not path:
                    return
                with open(path) as file:
                    request = json.load(file)
                os.unlink(path)
                reference = hosts[request["host"]].run_daemon.remote(request["command"], request["host"])
                threading.Thread(target=_answer, args=(reference, request["reply"]), daemon=True).start()


def _answer(reference, reply: str) -> None:
    try:
        status = ray.get(reference)
    except Exception:  # noqa: BLE001 - the actor died: the daemon with it
        status = 255
    with open(reply, "w") as file:
        file.write(f"{status}\n")
