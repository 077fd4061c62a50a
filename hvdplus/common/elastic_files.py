"""The folder `hvdplusrun` keeps for an elastic job across its launches of mpirun
(HVDPLUS_ELASTIC_DIR), and the file in it through which the launcher tells the ranks that
slots were added.

- `hosts.json`: written by the launcher when its host discovery finds more slots than the
  running job has: `{"generation": g, "slots": s}`. Each launch knows its own generation
  (HVDPLUS_ELASTIC_GENERATION), so the ranks on the launcher's host see a newer one at their
  next commit, and tell the others (hvdplus.elastic.State.check_host_updates).
- `commits/`: this host's copies of the job's commits (hvdplus.elastic.commits), under the
  same path on every host.

What the ranks tell the launcher travels in lines of their output instead
(hvdplus.common.launcher_messages), since rank 0 may run on another host. Every file is
replaced atomically, so a reader sees the old content or the new, whole.
"""

import json
import os

from .settings import env_names

__all__ = ["GENERATION_ENV", "write_atomically", "write_hosts", "read_hosts_generation"]

GENERATION_ENV = env_names("ELASTIC_GENERATION")[0]
_HOSTS = "hosts.json"


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers never see a partial file."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_hosts(folder: str, generation: int, slots: int) -> None:
    write_atomically(os.path.join(folder, _HOSTS),
                     json.dumps({"generation": generation, "slots": slots}).encode())


def read_hosts_generation(folder: str) -> int:
    """The newest host generation the launcher announced (0 before any, and on a host
    other than the launcher's)."""
    try:
        with open(os.path.join(folder, _HOSTS), "rb") as file:
            return int(json.loads(file.read())["generation"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0
