"""Process sets: subsets of the job's ranks whose collectives run on their own.

    evens = hvd.add_process_set([0, 2])          # every rank calls it, in the same order
    if evens.included():
        hvd.allreduce(x, process_set=evens)      # averaged over ranks 0 and 2

A set given as an mpi4py communicator (`ProcessSet(subcomm)`) is each rank's own, as in
Horovod: every rank may pass a different one (the halves of a `Split`), and every distinct
set of ranks the ranks' communicators hold is added, each rank's ProcessSet getting the id
of its own communicator's set.

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
            communicator whose processes are this rank's set (each rank may pass its own).
    """

    def __init__(self, ranks: Union[Sequence[int], "object"]):
        self.process_set_id: Optional[int] = None
        # A communicator's ranks are known once hvdplus runs: they are read when it is added.
        self.mpi_comm = ranks if hasattr(ranks, "Get_group") else None
        self.ranks: Optional[List[int]] = None if ranks is None or self.mpi_comm else _ranks_of(ranks)

    def __repr__(self):
        # Horovod's words (its __str__), which programs print and compare.
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

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
    """The job ranks of `comm`'s processes; ValueError if some process is not in the job."""
    from mpi4py import MPI

    job = runtime.current("ProcessSet(communicator)").topology.comm
    group, job_group = comm.Get_group(), job.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group)
    finally:
        group.Free()
        job_group.Free()
    if MPI.UNDEFINED in ranks:
        raise ValueError(f"ProcessSet({comm}): the communicator has processes outside the job")
    return sorted(ranks)


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

_follows_reforms = False  # whether _after_reform is registered (once for the process)


def init(comm=None, process_sets: Union[None, str, Sequence[ProcessSet]] = None) -> None:
    """Start hvdplus (see runtime.init), then add `process_sets` (a list of ProcessSets or
    rank lists, the same on every rank but for communicators, which are each rank's own;
    "dynamic", Horovod's switch for adding sets later, is accepted: sets can always be
    added later here).

    A refused list (ranks that disagree, a duplicate, a rank beyond the job) raises the same
    ValueError on every rank and adds none of its sets, while hvdplus stays initialized, as
    Horovod does: `size()`, `rank()` and the global set work, and `init` may be called again
    with a list that can be added.
    """
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError(f"init(process_sets={process_sets!r}): expected a list of process sets or 'dynamic'")
    started = not runtime.is_initialized()
    runtime.init(comm)
    if not runtime.is_initialized():
        return
    global_process_set.ranks = list(runtime.current("init()").ranks)
    if hasattr(comm, "Get_group") or started:
        global_process_set.mpi_comm = comm if hasattr(comm, "Get_group") else None
    global _follows_reforms
    if not _follows_reforms:
        runtime.on_reform(_after_reform)
        _follows_reforms = True
    listed = process_sets is not None and not isinstance(process_sets, str)
    # A starting job compares even an empty list: a rank that passed sets where another
    # passed none would otherwise wait for it forever.
    if listed or started:
        _add_all(list(process_sets) if listed else [], "init(process_sets=...)")


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
        mine = [_given(process_set) for process_set in sets]
    except Exception as error:  # noqa: BLE001 (this rank's own input: every rank raises it below)
        sets, mine = [], f"{type(error).__name__}: {error}"
    everyone = job.admin_comm.allgather(mine)
    fault = _fault_in(everyone, job)
    if fault:
        raise ValueError(f"{what}: {fault}")
    ids = {tuple(ranks): job.register_process_set(ranks) for ranks, _ in _sets_to_add(everyone)}
    for process_set, (_, ranks) in zip(sets, mine):
        process_set.ranks = ranks
        process_set.process_set_id = ids[tuple(ranks)]
    return sets


def _as_process_set(process_set) -> ProcessSet:
    return process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)


def _given(process_set: ProcessSet) -> tuple:
    """("comm", the job ranks of this rank's communicator) for a set given as a communicator,
    ("ranks", its ranks) for one given as ranks."""
    if process_set.mpi_comm is not None:
        return "comm", _communicator_ranks(process_set.mpi_comm)
    return "ranks", process_set.ranks


def _sets_to_add(everyone: list) -> List[tuple]:
    """(ranks, where in the list) of each set to add, in Horovod's order: first, list entry
    by list entry, the distinct sets of the ranks' communicators (sorted), then the sets
    given as ranks."""
    from_comms = [(ranks, index) for index, (kind, _) in enumerate(everyone[0]) if kind == "comm"
                  for ranks in sorted({tuple(given[index][1]) for given in everyone})]
    from_ranks = [(tuple(ranks), index) for index, (kind, ranks) in enumerate(everyone[0]) if kind == "ranks"]
    return [(list(ranks), index) for ranks, index in from_comms + from_ranks]


def _fault_in(everyone: list, job) -> Optional[str]:
    """Why the sets that every rank passed (`everyone[r]`: rank r's (kind, ranks) pairs, or
    the error its input raised) cannot be added; None when they can. Alike on every rank."""
    failed = [f"rank {r}: {given}" for r, given in enumerate(everyone) if isinstance(given, str)]
    if failed:
        return "; ".join(failed)
    shapes = [[ranks if kind == "ranks" else kind for kind, ranks in given] for given in everyone]
    if any(shape != shapes[0] for shape in shapes):
        return "the ranks disagree about the set's ranks: " + "; ".join(
            f"rank {r} passed {', '.join(map(_described, given)) or 'no set'}" for r, given in enumerate(everyone))
    size = job.topology.size
    holders = {tuple(ranks): f"process set {set_id}" for set_id, ranks in job.process_set_ranks.items()}
    for ranks, index in _sets_to_add(everyone):
        if ranks[-1] >= size:
            return f"set {ranks}: ranks must be below the job's size {size}"
        if tuple(ranks) in holders:
            return f"set {ranks}: {holders[tuple(ranks)]} has the same ranks"
        holders[tuple(ranks)] = f"set {index} of the list"
    return None


def _described(given: tuple) -> str:
    kind, ranks = given
    return str(ranks) if kind == "ranks" else f"a communicator of {ranks}"


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
