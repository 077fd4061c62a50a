"""The files through which an elastic job's ranks and `hvdplusrun` talk.

`hvdplusrun` gives an elastic job a folder (HVDPLUS_ELASTIC_DIR) that outlives each launch
of mpirun. In it:

- `state-<n>.pkl`: the last commit of the job's n-th state object, written by rank 0 at
  each `state.commit()`, read back when a restarted job syncs its state;
- `hosts.json`: written by the launcher when its host discovery finds more slots than the
  running job has: `{"generation": g, "slots": s}`. Each launch knows its own generation
  (HVDPLUS_ELASTIC_GENERATION), so the ranks see a newer one at their next commit;
- `restart.json`: written by rank 0 when the ranks end so that the launcher starts them
  again: why, and which ranks (on which hosts) died;
- `lost.json`: the hosts of the ranks a job lost and re-formed without (in place), so the
  launcher counts those slots as gone.

Every file is replaced atomically, so a reader sees the old content or the new, whole.
"""

import dataclasses
import json
import os
import pickle
from typing import Any, List, Optional

__all__ = [
    "GENERATION_ENV", "RestartRequest", "write_atomically", "state_path", "write_state", "read_state",
    "write_hosts", "read_hosts_generation", "write_restart", "take_restart", "add_lost_hosts", "read_lost_hosts",
]

GENERATION_ENV = "HVDPLUS_ELASTIC_GENERATION"
_HOSTS = "hosts.json"
_RESTART = "restart.json"
_LOST = "lost.json"


@dataclasses.dataclass
class RestartRequest:
    """Why the ranks of one launch ended: "failure" (ranks died) or "hosts" (slots were added)."""

    reason: str
    failed_ranks: List[int] = dataclasses.field(default_factory=list)
    failed_hosts: List[str] = dataclasses.field(default_factory=list)


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers never see a partial file."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def state_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"state-{index}.pkl")


def write_state(folder: str, index: int, snapshot: Any) -> None:
    write_atomically(state_path(folder, index), pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))


def read_state(folder: str, index: int) -> Optional[Any]:
    """The last commit of state `index`, or None when the job has not committed it yet."""
    try:
        with open(state_path(folder, index), "rb") as file:
            return pickle.load(file)
    except FileNotFoundError:
        return None


def write_hosts(folder: str, generation: int, slots: int) -> None:
    write_atomically(os.path.join(folder, _HOSTS),
                     json.dumps({"generation": generation, "slots": slots}).encode())


def read_hosts_generation(folder: str) -> int:
    """The newest host generation the launcher announced (0 before any)."""
    try:
        with open(os.path.join(folder, _HOSTS), "rb") as file:
            return int(json.loads(file.read())["generation"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def write_restart(folder: str, request: RestartRequest) -> None:
    write_atomically(os.path.join(folder, _RESTART), json.dumps(dataclasses.asdict(request)).encode())


def take_restart(folder: str) -> Optional[RestartRequest]:
    """The restart request the last launch left, removed from the folder; None if none."""
    path = os.path.join(folder, _RESTART)
    try:
        with open(path, "rb") as file:
            fields = json.loads(file.read())
    except FileNotFoundError:
        return None
    os.remove(path)
    return RestartRequest(**fields)


def add_lost_hosts(folder: str, hosts: List[str]) -> None:
    """Record the hosts of ranks that died (one entry per rank)."""
    write_atomically(os.path.join(folder, _LOST), json.dumps(read_lost_hosts(folder) + list(hosts)).encode())


def read_lost_hosts(folder: str) -> List[str]:
    try:
        with open(os.path.join(folder, _LOST), "rb") as file:
            return list(json.loads(file.read()))
    except (FileNotFoundError, ValueError):
        return []
