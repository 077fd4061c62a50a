"""What an elastic job rolls back to: states made of values, each kept by a handler.

A state holds named values (a model, an optimizer, an epoch counter) as its attributes.
For each one a handler knows how to keep a copy (`save`), bring the value back to that
copy (`restore`), and make every rank's value that of one rank (`sync`). `commit()` saves
every value and numbers the commit; under `hvdplusrun`'s elastic mode one rank of each host
also writes it to that host's disk in the background (hvdplus.elastic.commits), for a job
that must restart. With HVDPLUS_COMMIT_DIR (`--commit-dir`), rank 0 also writes each commit
to that shared folder, from which a requeued or later job resumes. `commit()` is also where
the ranks learn, all at once, that slots were added or that a stop signal arrived
(hvdplus.common.stop_requests).
"""

import copy
import itertools
from typing import Any, Callable, Dict, List, Optional

from ..common import elastic_files
from ..common.errors import HostsUpdatedInterrupt
from ..core import collectives, runtime
from ..common import stop_requests
from . import commits

__all__ = ["State", "ObjectState", "ObjectHandler", "StopRequested"]


class StopRequested(Exception):
    """Every rank stops at this commit, which is written: a stop signal reached some rank
    (`signal_name`). hvd.elastic.run ends the ranks (asking Slurm to requeue the job)."""

    def __init__(self, signal_name: str, commit_number: int):
        super().__init__(f"{signal_name} asked the job to stop; every rank stopped at commit {commit_number}")
        self.signal_name = signal_name
        self.commit_number = commit_number

# States are numbered in the order a program creates them, alike on every rank and in
# every launch, which names their files on disk.
_state_numbers = itertools.count()


class ObjectHandler:
    """Keeps a deep copy of a picklable value; sync broadcasts it from one rank.

    A handler of another kind of value subclasses it, overriding `save`, `restore` and
    `sync` and keeping its copy in `saved`. `sync` brings the value from `root_rank`: the
    rank that holds the newest commit, rank 0 unless a restart found it elsewhere."""

    def __init__(self, value: Any):
        self.saved = copy.deepcopy(value)

    def save(self, value: Any) -> None:
        self.saved = copy.deepcopy(value)

    def restore(self, value: Any) -> Any:
        return copy.deepcopy(self.saved)

    def sync(self, value: Any, name: str, root_rank: int = 0) -> Any:
        """`value` as `root_rank` holds it, on every rank."""
        return collectives.broadcast_object(value, root_rank=root_rank, name=name)

    def snapshot(self) -> Any:
        """The saved copy, as written to disk."""
        return self.saved

    def load(self, value: Any, snapshot: Any) -> Any:
        """Take `snapshot` (read from disk) as the saved copy, and restore `value` to it.
        Handlers of other kinds of values inherit this, and `snapshot`, as they are."""
        self.saved = snapshot
        return self.restore(value)


class State:
    """Values that roll back together: subclasses add them with `_track`.

    Args:
        handler_for: picks the handler of a value; ObjectHandler unless a framework knows better.
    """

    def __init__(self, handler_for: Callable[[Any], Any] = ObjectHandler):
        self._handler_for = handler_for
        self._handlers: Dict[str, Any] = {}
        self._reset_callbacks: List[Callable[[], None]] = []
        self._number = next(_state_numbers)
        self._synced_once = False
        self._generation = _launch_generation()
        # The number of the commit the saved copies hold: commits count up across the whole
        # job, restarts included, so that the newest one anywhere can be told (0: none yet).
        self.commit_number = 0
        # This host's copy of the commits on disk, under hvdplusrun's elastic mode; None keeps
        # commits in memory only.
        folder = _elastic_dir()
        self.disk_commits: Optional[commits.HostCommits] = (
            commits.HostCommits(commits.host_folder(folder), self._number) if folder else None)
        # The shared folder's copy (HVDPLUS_COMMIT_DIR), which rank 0 writes.
        shared = runtime.settings("elastic state").commit_dir
        self.shared_commits: Optional[commits.SharedCommits] = (
            commits.SharedCommits(shared, self._number) if shared else None)
        # Where the ranks outlive a dead one, the memory of the survivors holds the last commit
        # and only a lost host needs the disk: the write goes on beside training. Elsewhere any
        # failure ends every rank, and each commit is written before training goes on.
        self._wait_for_writes = not runtime.settings("elastic state").ulfm

    def _track(self, name: str, value: Any) -> None:
        setattr(self, name, value)
        self._handlers[name] = self._handler_for(value)

    # -- Horovod's State API ------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Call each of `callbacks` after every re-form of the job (e.g. to scale the
        learning rate to the new `size()`)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """What a subclass must redo for the new job size (nothing by default)."""

    def commit(self) -> None:
        """Save every value, and write them to this host's disk (one rank per host; in the
        background where MPI lets the ranks outlive a dead one); raise HostsUpdatedInterrupt
        on every rank when the launcher has added slots."""
        self._wait_for_disk()  # the copies a write reads are about to be overwritten
        self.save()
        self.commit_number += 1
        for writer in self._disk_writers():
            writer.write_in_background(self.commit_number, self._snapshot())
            if self._wait_for_writes:
                writer.wait()
        self.check_host_updates()

    def write_checkpoint(self) -> None:
        """Make sure this host's disk holds the last commit, before the ranks end for a
        restart (every rank may call it; one rank per host writes)."""
        self._wait_for_disk()
        for writer in self._disk_writers():
            if writer.newest() < self.commit_number:
                writer.write(self.commit_number, self._snapshot())

    def check_host_updates(self) -> None:
        """Raise StopRequested (on every rank alike, once this commit is on disk) if a stop
        signal reached any rank, or HostsUpdatedInterrupt if the launcher announced more
        slots since this launch began. The ranks on the launcher's host read its
        announcement; the others learn both from one collective."""
        folder = _elastic_dir()
        # Alike on every rank (a variable of the job), so every rank makes the collective or none.
        watching = bool(runtime.settings("elastic state").stop_signals)
        if folder is None and not watching:
            return
        generation = elastic_files.read_hosts_generation(folder) if folder is not None else 0
        answers = collectives.allgather_object((generation, stop_requests.requested()),
                                               name=f"elastic.hosts.{self._number}")
        stop = next((signal_name for _, signal_name in answers if signal_name), None)
        if stop is not None:
            self.write_checkpoint()
            raise StopRequested(stop, self.commit_number)
        newest = max(generation for generation, _ in answers)
        if folder is not None and newest > self._generation:
            self._generation = newest
            raise HostsUpdatedInterrupt(skip_sync=False, message="slots were added to the job")

    def save(self) -> None:
        for name, handler in self._handlers.items():
            handler.save(getattr(self, name))

    def restore(self) -> None:
        """Bring every value back to its last commit."""
        for name, handler in self._handlers.items():
            setattr(self, name, handler.restore(getattr(self, name)))

    def sync(self) -> None:
        """Make every rank's values those of the newest commit any rank holds, in memory or
        on its host's disk (rank 0's values when none has committed), and save them.

        After a restart, the commit comes from the disk of a host that holds the newest; the
        reset callbacks then run, as after any re-form, since the job that made the commit
        may have had another size."""
        first_sync, self._synced_once = not self._synced_once, True
        self._wait_for_disk()  # save() below overwrites the copies a write may still read
        on_disk = self.disk_commits.newest() if self.disk_commits is not None else 0
        # Rank 0 alone looks in the shared folder: one reader is enough, and cheaper.
        shared = self.shared_commits.newest() if self.shared_commits is not None and runtime.rank() == 0 else 0
        numbers = collectives.allgather_object(max(self.commit_number, on_disk, shared),
                                               name=f"elastic.commits.{self._number}")
        newest = max(numbers)
        root = numbers.index(newest)
        if runtime.rank() == root and max(on_disk, shared) > self.commit_number:
            self._load_from_disk(self.disk_commits if on_disk >= shared else self.shared_commits)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.sync(getattr(self, name), f"elastic.sync.{self._number}.{name}", root))
        self.save()
        self.commit_number = newest
        for writer in self._disk_writers():
            if writer.newest() < newest:  # this host (the shared folder) holds it too from now on
                writer.write_in_background(newest, self._snapshot())
        if first_sync and newest > 0:
            self.on_reset()

    # -- disk -----------------------------------------------------------------------
    def _writes_to_disk(self) -> bool:
        return self.disk_commits is not None and runtime.local_rank() == 0

    def _disk_writers(self) -> List[commits.HostCommits]:
        """Where this rank writes commits: its host's folder (one rank per host) and the
        shared folder (rank 0)."""
        writers = [self.disk_commits] if self._writes_to_disk() else []
        if self.shared_commits is not None and runtime.rank() == 0:
            writers.append(self.shared_commits)
        return writers

    def _wait_for_disk(self) -> None:
        for writer in (self.disk_commits, self.shared_commits):
            if writer is not None:
                writer.wait()

    def _snapshot(self) -> Dict[str, Any]:
        return {name: handler.snapshot() for name, handler in self._handlers.items()}

    def _load_from_disk(self, source: commits.HostCommits) -> None:
        """Take the commit on disk in `source` (this host's folder, or the shared one) as
        the saved copies and the values."""
        found = source.read()
        if found is None:
            raise RuntimeError(f"hvdplus: rank {runtime.rank()} found commit {source.newest()} in "
                               f"{source.paths}, but could not read it back")
        number, snapshot = found
        for name, handler in self._handlers.items():
            if name in snapshot:
                setattr(self, name, handler.load(getattr(self, name), snapshot[name]))
        self.commit_number = number


class ObjectState(State):
    """Picklable values, given as keywords, that become attributes: `state.epoch`."""

    def __init__(self, **values: Any):
        super().__init__()
        for name, value in values.items():
            self._track(name, value)


def _elastic_dir() -> Optional[str]:
    return runtime.settings("elastic state").elastic_dir


def _launch_generation() -> int:
    return runtime.settings("elastic state").elastic_generation
