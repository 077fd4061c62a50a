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
    """Keeps a deep copy of a picklable value; sync broadcasts it from rank 0."""

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
        """Take `snapshot` (read from disk) as the saved copy, and return it as the value."""
        self.saved = snapshot
        return copy.deepcopy(snapshot)


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

    def _track(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
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
        """Save every value (and write them to disk under an elastic launcher); raise
        HostsUpdatedInterrupt on every rank when the launcher has added slots."""
        self.save()
        folder = _elastic_dir()
        if folder is not None and runtime.rank() == 0:
            elastic_files.write_state(folder, self._number, self._snapshot())
        self.check_host_updates()

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
            object.__setattr__(self, name, handler.restore(getattr(self, name)))

    def sync(self) -> None:
        """Make every rank's values rank 0's, and save them. The first sync of a job that
        restarted first loads, on rank 0, the last commit written to disk."""
        if not self._synced_once:
            self._synced_once = True
            self._load_from_disk()
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.sync(getattr(self, name), f"elastic.sync.{self._number}.{name}"))
        self.save()

    # -- disk -----------------------------------------------------------------------
    def _snapshot(self) -> Dict[str, Any]:
        return {name: handler.snapshot() for name, handler in self._handlers.items()}

    def _load_from_disk(self) -> None:
        folder = _elastic_dir()
        if folder is None or runtime.rank() != 0:
            return
        snapshot = elastic_files.read_state(folder, self._number)
        if snapshot is None:
            return
        for name, handler in self._handlers.items():
            if name in snapshot:
                object.__setattr__(self, name, handler.load(getattr(self, name), snapshot[name]))


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
