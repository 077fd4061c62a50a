"""What an elastic job rolls back to: states made of values, each kept by a handler.

A state holds named values (a model, an optimizer, an epoch counter) as its attributes.
For each one a handler knows how to keep a copy (`save`), bring the value back to that
copy (`restore`), and make every rank's value rank 0's (`sync`). `commit()` saves every
value, and under `hvdplusrun`'s elastic mode also writes the copies to disk (rank 0),
for a job that must restart; it is also where the ranks learn that slots were added.
"""

import copy
import itertools
import os
from typing import Any, Callable, Dict, List, Optional

from ..common import elastic_files
from ..common.errors import HostsUpdatedInterrupt
from ..engine import collectives, runtime

__all__ = ["State", "ObjectState", "ObjectHandler"]

# States are numbered in the order a program creates them, alike on every rank and in
# every launch, which names their files on disk.
_state_numbers = itertools.count()


class ObjectHandler:
    """Keeps a deep copy of a picklable value; sync broadcasts it from rank 0.

    A handler of another kind of value subclasses it, overriding `save`, `restore` and
    `sync` and keeping its copy in `saved`."""

    def __init__(self, value: Any):
        self.saved = copy.deepcopy(value)

    def save(self, value: Any) -> None:
        self.saved = copy.deepcopy(value)

    def restore(self, value: Any) -> Any:
        return copy.deepcopy(self.saved)

    def sync(self, value: Any, name: str) -> Any:
        return collectives.broadcast_object(value, root_rank=0, name=name)

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
        # Where rank 0 writes commits: the elastic launcher's folder, so that a job it
        # restarts finds the last one; None keeps commits in memory only.
        self.checkpoint_dir: Optional[str] = _elastic_dir()
        # Where the ranks outlive a dead one, the survivors hold the last commit in memory
        # and write it only when the job must restart (write_checkpoint); elsewhere every
        # commit goes to disk, since a failure ends every rank.
        self._every_commit_to_disk = not runtime.current("elastic state").settings.ulfm

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
        """Save every value (and, where a failure would end every rank, write them to
        `checkpoint_dir`); raise HostsUpdatedInterrupt on every rank when the launcher has
        added slots."""
        self.save()
        if self._every_commit_to_disk:
            self.write_checkpoint()
        self.check_host_updates()

    def write_checkpoint(self) -> None:
        """Write the last commit to `checkpoint_dir` (on rank 0; every rank may call it)."""
        if self.checkpoint_dir is not None and runtime.rank() == 0:
            elastic_files.write_state(self.checkpoint_dir, self._number, self._snapshot())

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt (on every rank alike) if the launcher announced
        more slots since this launch began."""
        folder = _elastic_dir()
        if folder is None:
            return
        newer = runtime.rank() == 0 and elastic_files.read_hosts_generation(folder) > self._generation
        if collectives.broadcast_object(newer, root_rank=0, name=f"elastic.hosts.{self._number}"):
            self._generation = elastic_files.read_hosts_generation(folder) if runtime.rank() == 0 else self._generation
            raise HostsUpdatedInterrupt(skip_sync=False, message="slots were added to the job")

    def save(self) -> None:
        for name, handler in self._handlers.items():
            handler.save(getattr(self, name))

    def restore(self) -> None:
        """Bring every value back to its last commit."""
        for name, handler in self._handlers.items():
            setattr(self, name, handler.restore(getattr(self, name)))

    def sync(self) -> None:
        """Make every rank's values rank 0's, and save them. The first sync of a job that
        restarted first loads, on rank 0, the last commit written to disk, and then runs
        the reset callbacks, as after any re-form."""
        restarted = False
        if not self._synced_once:
            self._synced_once = True
            restarted = collectives.broadcast_object(self._load_from_disk(), root_rank=0,
                                                     name=f"elastic.restarted.{self._number}")
        for name, handler in self._handlers.items():
            setattr(self, name, handler.sync(getattr(self, name), f"elastic.sync.{self._number}.{name}"))
        self.save()
        if restarted:
            # The commit was made by a job of another size: what the reset callbacks
            # adapt to the size (a learning rate, say) must be adapted again.
            self.on_reset()

    # -- disk -----------------------------------------------------------------------
    def _snapshot(self) -> Dict[str, Any]:
        return {name: handler.snapshot() for name, handler in self._handlers.items()}

    def _load_from_disk(self) -> bool:
        """On rank 0, take the last commit written to disk, if there is one; whether it did."""
        if self.checkpoint_dir is None or runtime.rank() != 0:
            return False
        snapshot = elastic_files.read_state(self.checkpoint_dir, self._number)
        if snapshot is None:
            return False
        for name, handler in self._handlers.items():
            if name in snapshot:
                setattr(self, name, handler.load(getattr(self, name), snapshot[name]))
        return True


class ObjectState(State):
    """Picklable values, given as keywords, that become attributes: `state.epoch`."""

    def __init__(self, **values: Any):
        super().__init__()
        for name, value in values.items():
            self._track(name, value)


def _elastic_dir() -> Optional[str]:
    return runtime.current("elastic state").settings.elastic_dir


def _launch_generation() -> int:
    return int(os.environ.get(elastic_files.GENERATION_ENV, "0") or 0)
