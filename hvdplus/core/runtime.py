"""Process-wide state of hvdplus: `init`, `shutdown` and the rank and size queries.

Importing hvdplus does not start MPI; `init()` does (through mpi4py, at the thread level
mpi4py asks for, MPI_THREAD_MULTIPLE by default). Under `hvdplusrun`, `mpirun`, `mpiexec`
or Slurm's `srun` the ranks come from MPI; with no launcher the process is a job of one.
"""

import atexit
import itertools
import os
import sys
from typing import Callable, List, Optional, Sequence, Tuple, Union

from ..common import stop_requests
from ..common.errors import NotInitializedError
from ..common.settings import Settings, overlaps_compute
from . import mpi_environment, slurm_steps

__all__ = [
    "init", "shutdown", "is_initialized", "current",
    "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "start_timeline", "stop_timeline", "reform", "on_reform", "peers_lost", "settings",
]


class Runtime:
    """Everything `init()` sets up, for the job or for one process set of it; lives until
    `shutdown()`.

    Args:
        topology: the communicators; the Runtime owns them.
        settings: the job's settings.
        ranks: the job ranks this runtime spans, in its own rank order (None: the job's).
    """

    def __init__(self, topology, settings: Settings, ranks: Optional[List[int]] = None):
        from ..comm.algorithms import CollectiveAlgorithms
        from ..engine.engine import Engine

        self.topology = topology
        self.settings = settings
        self.ranks = list(range(topology.size)) if ranks is None else list(ranks)
        # Process sets (see process_sets.py) are made and removed on this communicator,
        # never on the engine's, whose collectives run on the engine thread.
        self.admin_comm = topology.comm.Dup() if ranks is None else None
        # Point-to-point messages (p2p.py, comm/point_to_point.py) between job ranks, away from the collectives.
        self.p2p_comm = topology.comm.Dup() if ranks is None else None
        self.process_sets: dict = {}  # process set id -> the Runtime of a set this rank is in
        self.process_set_ranks: dict = {0: self.ranks}  # every added set's ranks, by id
        self._next_process_set_id = 1
        self.algorithms = CollectiveAlgorithms(topology, settings.allreduce_algorithm,
                                               single_copy=settings.single_copy)
        # Where each rank runs, to tell the launcher which hosts lost a rank.
        self.hosts = topology.comm.allgather(_host_name()) if settings.ulfm else [""] * topology.size
        overlap = overlaps_compute(settings.overlap, topology.local_comm.Get_size())
        self.engine = Engine(topology.comm, settings, self.algorithms, overlap=overlap, revoke_all=self.revoke)
        self._name_counters = {}

    @property
    def is_job(self) -> bool:
        """Whether this runtime spans the whole job (rather than a process set of it)."""
        return self.admin_comm is not None

    @property
    def process_set_ids(self):
        return self.process_set_ranks.keys()

    def set_rank_of(self, job_rank: int, what: str) -> int:
        """This runtime's rank of job rank `job_rank`; ValueError if it is not one of ours."""
        if job_rank not in self.ranks:
            raise ValueError(f"{what}: rank {job_rank} is not in the process set {self.ranks}")
        return self.ranks.index(job_rank)

    def register_process_set(self, ranks: List[int]) -> int:
        """Make a process set of job ranks `ranks` (collective on the job); returns its id."""
        from mpi4py import MPI

        from ..comm.topology import build_topology

        set_id = self._next_process_set_id
        self._next_process_set_id += 1
        member = self.topology.rank in ranks
        comm = self.admin_comm.Split(color=0 if member else MPI.UNDEFINED, key=self.topology.rank)
        if member:
            self.process_sets[set_id] = Runtime(build_topology(comm, self.settings), self.settings, ranks=ranks)
        self.process_set_ranks[set_id] = list(ranks)
        return set_id

    def unregister_process_set(self, set_id: int) -> None:
        """Remove process set `set_id` (collective on the job): its members stop its engine."""
        member = self.process_sets.pop(set_id, None)
        del self.process_set_ranks[set_id]
        if member is not None:
            member.close()

    def close(self) -> None:
        """Stop the engine and free the communicators, process sets first."""
        for set_id in list(self.process_sets):
            self.process_sets.pop(set_id).close()
        self.engine.stop()
        if not self.engine.peers_lost:
            self.algorithms.free()
            if self.admin_comm is not None:
                self.admin_comm.Free()
                self.p2p_comm.Free()
            self.topology.free()

    def abandon(self) -> None:
        """After a peer died: revoke and leave everything, process sets included."""
        for member in self.process_sets.values():
            member.abandon()
        self.revoke()
        self.engine.abandon()

    def revoke(self) -> None:
        """Revoke every communicator this runtime uses (a peer died; see comm.failures)."""
        from ..comm.failures import revoke

        topology = self.topology
        revoke([self.engine.control_comm if hasattr(self, "engine") else None, self.admin_comm, self.p2p_comm,
                topology.local_comm, topology.cross_comm, topology.comm])

    def name_for(self, kind: str, name: Optional[str]) -> str:
        """`name`, or a deterministic one ("allreduce.7"): the n-th unnamed call of a kind
        gets the same name on every rank that runs the same program."""
        if name is not None:
            return str(name)
        counter = self._name_counters.setdefault(kind, itertools.count())
        return f"{kind}.{next(counter)}"


def _host_name() -> str:
    import socket

    return socket.gethostname()


_runtime: Optional[Runtime] = None
_previous_excepthook = None
_exit_hook_registered = False
_reform_callbacks: List[Callable[[], None]] = []


def init(comm: Union[None, "object", Sequence[int]] = None) -> None:
    """Start hvdplus on this process; calling it again is harmless.

    Args:
        comm: None for every process of the job (MPI_COMM_WORLD); an mpi4py communicator,
            which is duplicated so hvdplus traffic never meets the caller's; or a list of
            world ranks, which every process must pass alike. A process left out of that
            list stays uninitialized.
    """
    global _runtime
    if _runtime is not None:
        return
    # Before MPI starts: srun without a PMI server would give every task a job of its own.
    srun_step = slurm_steps.check_before_mpi_init(os.environ) if comm is None else None
    mpi_environment.prepare()
    from mpi4py import MPI

    slurm_steps.check_after_mpi_init(srun_step, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())

    from ..comm.topology import build_topology

    settings = Settings.from_env()
    base = _communicator(MPI, comm)
    if base == MPI.COMM_NULL:
        return
    _runtime = Runtime(build_topology(base, settings), settings)
    stop_requests.install(settings.stop_signals, at_init=True)
    if _runtime.topology.size > 1:
        _install_abort_on_uncaught_exception(MPI)
    _register_shutdown_at_exit()


def _communicator(MPI, comm):
    if comm is None:
        return MPI.COMM_WORLD.Dup()
    if isinstance(comm, MPI.Intracomm):
        return comm.Dup()
    if isinstance(comm, MPI.Comm):
        raise TypeError(f"init(comm=...) needs an intracommunicator, got {type(comm).__name__}")
    ranks = list(comm)
    world_size = MPI.COMM_WORLD.Get_size()
    bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < world_size]
    if bad or len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(
            f"init(comm={ranks!r}): expected distinct world ranks in [0, {world_size})"
        )
    group = MPI.COMM_WORLD.Get_group().Incl(ranks)
    try:
        return MPI.COMM_WORLD.Create(group)
    finally:
        group.Free()


def _install_abort_on_uncaught_exception(MPI) -> None:
    """An uncaught exception on one rank would leave the others waiting in a collective
    forever; abort the whole job instead, after printing the traceback."""
    global _previous_excepthook
    _previous_excepthook = sys.excepthook

    def abort_job(exc_type, exc, traceback):
        _previous_excepthook(exc_type, exc, traceback)
        sys.stderr.write(f"hvdplus: uncaught {exc_type.__name__} on rank {rank()}; aborting the job\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = abort_job


def _register_shutdown_at_exit() -> None:
    """Stop the engine before mpi4py finalizes MPI (atexit runs the later registration first)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(shutdown)
        _exit_hook_registered = True


def shutdown() -> None:
    """Stop the engine and release hvdplus' communicators; `init()` may be called again.

    Operations still pending on any rank fail with ShutdownError on every rank."""
    global _runtime, _previous_excepthook
    if _runtime is None:
        return
    runtime, _runtime = _runtime, None
    if _previous_excepthook is not None:
        sys.excepthook, _previous_excepthook = _previous_excepthook, None
    runtime.close()


def reform() -> List[Tuple[int, str]]:
    """Re-form the job on the ranks that are still alive, after a peer died (collective on
    the survivors; needs MPI with failure mitigation, see `Settings.ulfm`). Returns the
    (old rank, host) of each rank that died.

    The old runtime is abandoned where it stands: its communicators are revoked and left to
    MPI, since freeing one would wait for the dead rank. The survivors keep their order, so
    rank 0 of the new job is the lowest surviving rank of the old one. A rank that dies
    while the job re-forms makes the survivors shrink once more."""
    global _runtime
    from ..comm.failures import is_process_failure, revoke, shrink
    from ..comm.topology import build_topology

    old = current("reform()")
    old.abandon()
    _runtime = None
    comm = old.topology.comm
    while _runtime is None:
        comm = shrink(comm)
        try:
            _runtime = Runtime(build_topology(comm, old.settings), old.settings)
        except Exception as exc:  # noqa: BLE001 (only a dead peer is retried)
            if not is_process_failure(exc):
                raise
            revoke([comm])
    lost = _lost_ranks(old.topology.comm, _runtime.topology.comm, old.hosts)
    for callback in list(_reform_callbacks):
        callback()
    return lost


def _lost_ranks(before, after, hosts) -> List[Tuple[int, str]]:
    from mpi4py import MPI

    group_before, group_after = before.Get_group(), after.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group_before, list(range(group_before.Get_size())), group_after)
    finally:
        group_before.Free()
        group_after.Free()
    return [(old, hosts[old]) for old, new in enumerate(ranks) if new == MPI.UNDEFINED]


def on_reform(callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback()` on this rank after each `reform()` (e.g. to re-read `size()`);
    returns a function that removes it again."""
    _reform_callbacks.append(callback)
    return lambda: _reform_callbacks.remove(callback) if callback in _reform_callbacks else None


def settings(what: str = "") -> Settings:
    """The running job's settings, or NotInitializedError naming the call that needed them."""
    return current(what).settings


def peers_lost() -> bool:
    """Whether this job's engine found that a peer died (a re-form is due; see reform)."""
    return is_initialized() and _runtime.engine.peers_lost


def is_initialized() -> bool:
    return _runtime is not None


def current(what: str = "") -> Runtime:
    """The live runtime, or NotInitializedError naming the call that needed it."""
    if _runtime is None:
        raise NotInitializedError(what)
    return _runtime


def size() -> int:
    """Number of ranks in the job."""
    return current("size()").topology.size


def rank() -> int:
    """This process' rank in [0, size())."""
    return current("rank()").topology.rank


def local_size() -> int:
    """Number of ranks on this node."""
    return current("local_size()").topology.local_comm.Get_size()


def local_rank() -> int:
    """This process' rank among the ranks of its node."""
    return current("local_rank()").topology.local_comm.Get_rank()


def cross_size() -> int:
    """Number of nodes that have a rank with this process' local rank."""
    return current("cross_size()").topology.cross_comm.Get_size()


def cross_rank() -> int:
    """This node's index among the nodes (ranks with the same local rank)."""
    return current("cross_rank()").topology.cross_comm.Get_rank()


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return current("is_homogeneous()").topology.homogeneous


def mpi_threads_supported() -> bool:
    """True when MPI runs at MPI_THREAD_MULTIPLE, so any thread may call into it."""
    current("mpi_threads_supported()")
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True once initialized: MPI is hvdplus' only transport."""
    current("mpi_enabled()")
    return True


def mpi_built() -> bool:
    """True when mpi4py, hvdplus' MPI binding, can be imported."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline to `file_path` (rank 0 writes it; call on every
    rank). With `mark_cycles` (or HVDPLUS_TIMELINE_MARK_CYCLES), each engine cycle that runs
    collectives is marked by a CYCLE_START event."""
    current("start_timeline()").engine.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop writing the timeline and close its file as valid JSON."""
    current("stop_timeline()").engine.stop_timeline()
