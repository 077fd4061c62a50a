"""Process sets: subsets of the job's ranks whose collectives run on their own.

    evens = hvd.add_process_set([0, 2])          # every rank calls it, in the same order
    if evens.included():
        hvd.allreduce(x, process_set=evens)      # averaged over ranks 0 and 2

Each set has an engine, a topology and algorithms of its own (a Runtime over a
communicator of its ranks), so collectives on disjoint sets run independently: a stall
in one set never holds up another, and names are scoped per set. Ranks are the job's
(global) ranks everywhere, as in Horovod: `root_rank` of a broadcast on a set is a job
rank, which must belong to the set. Sets are made and removed collectively, over every
rank of the job; ranks that disagree about a set's ranks get a ValueError, all of them.
"""

import numbers
from typing import List, Optional, Sequence, Union

from . import runtime

__all__ = ["ProcessSet", "global_process_set", "init", "add_process_set", "remove_process_set", "runtime_of",
           "require_member", "is_job", "size_of_id", "includes_this_rank",
           "size_in", "rank_in", "overlaps_in", "name_in", "ranks_in"]


class ProcessSet:
    """A set of the job's ranks. Until it is added (`add_process_set`, or `init(process_sets=
    [...])`), it is only a description; `process_set_id` is None then.

    Args:
        ranks: the job ranks of the set (any order; duplicates are an error), or an mpi4py
            communicator whose processes are the set.
    """

    def __init__(self, ranks: Union[Sequence[int], "object"]):
        self.process_set_id: Optional[int] = None
        # A communicator's ranks are known once hvdplus runs: they are read when it is added.
        self.mpi_comm = ranks if hasattr(ranks, "Get_group") else None
        self.ranks: Optional[List[int]] = None if ranks is None or self.mpi_comm else _ranks_of(ranks)

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self):
        return hash(tuple(self.ranks or ()))

    def size(self) -> int:
        """Number of ranks in the set."""
        return len(self._added("size()").ranks)

    def rank(self) -> int:
        """This process' rank within the set (its index in `ranks`), or -1 if not included."""
        ranks = self._added("rank()").ranks
        me = runtime.rank()
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        """Whether this process belongs to the set."""
        return runtime.rank() in self._added("included()").ranks

    def _added(self, what: str) -> "ProcessSet":
        if self.process_set_id is None:
            raise ValueError(f"process set {self.ranks}: {what} needs the set added first "
                             "(hvd.add_process_set, or hvd.init(process_sets=[...]))")
        return self


def _ranks_of(ranks) -> List[int]:
    ranks = list(ranks)
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0]
    if bad or len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(f"ProcessSet({ranks!r}): expected distinct, non-negative job ranks")
    return sorted(int(r) for r in ranks)


def _communicator_ranks(comm) -> List[int]:
    from mpi4py import MPI

    job = runtime.current("ProcessSet(communicator)").topology.comm
    group, job_group = comm.Get_group(), job.Get_group()
    try:
        return sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group))
    finally:
        group.Free()
        job_group.Free()


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

_follows_reforms = False  # whether _after_reform is registered (once for the process)


def init(comm=None, process_sets: Union[None, str, Sequence[ProcessSet]] = None) -> None:
    """Start hvdplus (see runtime.init), then add `process_sets` (a list of ProcessSets or
    rank lists, the same on every rank; "dynamic", Horovod's switch for adding sets later,
    is accepted: sets can always be added later here).

    All or nothing: when a set cannot be added (ranks that disagree, a duplicate, a rank
    beyond the job), every rank raises the same ValueError and no set is added; a runtime
    this call started is shut down again, so that a later `init` starts afresh.
    """
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError(f"init(process_sets={process_sets!r}): expected a list of process sets or 'dynamic'")
    started = not runtime.is_initialized()
    runtime.init(comm)
    if not runtime.is_initialized():
        return
    listed = process_sets is not None and not isinstance(process_sets, str)
    try:
        global_process_set.ranks = list(runtime.current("init()").ranks)
        # A starting job compares even an empty list: a rank that passed sets where another
        # passed none would otherwise wait for it forever.
        if listed or started:
            _add_all(list(process_sets) if listed else [], "init(process_sets=...)")
    except Exception:
        if started:
            runtime.shutdown()
            global_process_set.ranks = None
        raise
    global _follows_reforms
    if not _follows_reforms:
        runtime.on_reform(_after_reform)
        _follows_reforms = True


def _after_reform() -> None:
    """A re-formed job (hvdplus.elastic) has new ranks and no process sets yet."""
    global_process_set.ranks = list(runtime.current("reform()").ranks)


def runtime_of(process_set: Optional[ProcessSet], what: str) -> "runtime.Runtime":
    """The Runtime that runs `process_set`'s collectives on this rank (the job's own for the
    global set or None); ValueError if this rank is not in the set."""
    job = runtime.current(what)
    if is_job(process_set):
        return job
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"{what}: process_set must be an hvdplus ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{what}: process set {process_set.ranks} has not been added (hvd.add_process_set)")
    member = job.process_sets.get(process_set.process_set_id)
    # After a re-form (hvdplus.elastic) ids start again: a set is its id and its ranks.
    if job.process_set_ranks.get(process_set.process_set_id) != process_set.ranks:
        raise ValueError(f"{what}: process set {process_set.ranks} was removed, or the job re-formed since "
                         "it was added")
    if member is None:
        raise ValueError(f"{what} on process set {process_set.ranks}, which does not include rank "
                         f"{job.topology.rank}")
    return member


def require_member(process_set: Optional[ProcessSet], what: str) -> None:
    """Raise now, when a call is made or traced, what runtime_of raises for `process_set`
    (not initialized, not added, removed, or without this rank)."""
    runtime_of(process_set, what)


def is_job(process_set: Optional[ProcessSet]) -> bool:
    """Whether `process_set` stands for the whole job (None or the global set)."""
    return process_set is None or process_set.process_set_id == 0


def size_of_id(process_set_id: int, what: str) -> int:
    """How many ranks the process set with id `process_set_id` has, whether or not this rank
    is in it; ValueError for an id no set has."""
    ranks = runtime.current(what).process_set_ranks.get(process_set_id)
    if ranks is None:
        raise ValueError(f"{what}: no process set has id {process_set_id}")
    return len(ranks)


def includes_this_rank(process_set_id: int, what: str) -> Optional[bool]:
    """Whether this rank is in the process set with id `process_set_id`; None for an id no
    set has."""
    job = runtime.current(what)
    if process_set_id not in job.process_set_ranks:
        return None
    return process_set_id == 0 or process_set_id in job.process_sets


def size_in(process_set: Optional[ProcessSet], what: str) -> int:
    """How many ranks `process_set` has (the job's, for None); errors as runtime_of's."""
    return runtime_of(process_set, what).topology.size


def rank_in(process_set: Optional[ProcessSet], what: str) -> int:
    """This rank's place in `process_set` (in the job, for None); errors as runtime_of's."""
    return runtime_of(process_set, what).topology.rank


def ranks_in(process_set: Optional[ProcessSet], what: str) -> List[int]:
    """The job ranks of `process_set`'s members, in the set's order."""
    return list(runtime_of(process_set, what).ranks)


def overlaps_in(process_set: Optional[ProcessSet], what: str) -> bool:
    """Whether `process_set`'s engine runs agreed collectives in the background at once
    (HVDPLUS_OVERLAP), rather than when a rank waits."""
    return runtime_of(process_set, what).engine.overlap


def name_in(process_set: Optional[ProcessSet], kind: str, name: Optional[str], what: str) -> str:
    """`name`, or the next of `process_set`'s names for unnamed calls of `kind`
    ("grouped_allgather.3"), alike on every rank that runs the same program."""
    return runtime_of(process_set, what).name_for(kind, name)


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Add a set (collective over every rank of the job, in the same order everywhere);
    returns it, with its `process_set_id`. ValueError on every rank when the ranks passed
    differ between ranks, or a set of the same ranks exists."""
    return _add_all([process_set], "add_process_set()")[0]


def _add_all(process_sets: list, what: str) -> List[ProcessSet]:
    """Add every set of `process_sets` (collective over the job), or none: the ranks first
    share what each was given, so each finds the same fault, if any, and raises it."""
    job = runtime.current(what)
    try:
        sets = [_as_process_set(process_set) for process_set in process_sets]
        mine = [process_set.ranks for process_set in sets]
    except Exception as error:  # noqa: BLE001 (this rank's own input: every rank raises it below)
        sets, mine = [], f"{type(error).__name__}: {error}"
    fault = _fault_in(job.admin_comm.allgather(mine), job)
    if fault:
        raise ValueError(f"{what}: {fault}")
    for process_set in sets:
        process_set.process_set_id = job.register_process_set(process_set.ranks)
    return sets


def _as_process_set(process_set) -> ProcessSet:
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        process_set.ranks = _communicator_ranks(process_set.mpi_comm)
    return process_set


def _fault_in(everyone: list, job) -> Optional[str]:
    """Why the sets that every rank passed (`everyone[r]`: rank r's rank lists, or the error
    its input raised) cannot be added; None when they can. Alike on every rank."""
    failed = [f"rank {r}: {given}" for r, given in enumerate(everyone) if isinstance(given, str)]
    if failed:
        return "; ".join(failed)
    if any(given != everyone[0] for given in everyone):
        return "the ranks disagree about the set's ranks: " + "; ".join(
            f"rank {r} passed {', '.join(map(str, given)) or 'no set'}" for r, given in enumerate(everyone))
    size = job.topology.size
    holders = {tuple(ranks): f"process set {set_id}" for set_id, ranks in job.process_set_ranks.items()}
    for index, ranks in enumerate(everyone[0]):
        if ranks[-1] >= size:
            return f"set {ranks}: ranks must be below the job's size {size}"
        if tuple(ranks) in holders:
            return f"set {ranks}: {holders[tuple(ranks)]} has the same ranks"
        holders[tuple(ranks)] = f"set {index} of the list"
    return None


def remove_process_set(process_set: ProcessSet) -> None:
    """Remove an added set (collective over every rank of the job); its collectives still
    pending fail with ShutdownError. The global set cannot be removed."""
    job = runtime.current("remove_process_set()")
    set_id = process_set.process_set_id
    everyone = job.admin_comm.allgather(set_id)
    if any(other != set_id for other in everyone):
        raise ValueError("remove_process_set: the ranks disagree about the set: "
                         + "; ".join(f"rank {r} passed set {other}" for r, other in enumerate(everyone)))
    if set_id == 0:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if set_id not in job.process_set_ids:
        raise ValueError(f"remove_process_set: process set {process_set.ranks} is not added")
    job.unregister_process_set(set_id)
    process_set.process_set_id = None
