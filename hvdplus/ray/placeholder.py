"""A placeholder rank: the process mpirun starts for a rank that another process plays.

Under Ray Train the rank must be the Ray Train worker itself, which Ray started, not a
process of mpirun's. So mpirun starts this placeholder in the worker's place: it never
initializes MPI; it writes the variables through which Open MPI's runtime (PMIx) knows its
rank into a folder of the worker's, for the worker to take over, and waits there until the
worker has finished with MPI, so that mpirun counts the rank as running until then.

    python -m hvdplus.ray.placeholder     # started by mpirun's daemon, never by hand

The worker names the folder (HVDPLUS_PROXY_DIR) and itself (HVDPLUS_PROXY_OWNER, its pid) in
the daemon's environment, which the placeholder inherits. It ends with status 0 once the
worker writes the `done` file into the folder, and with status 1 when the worker ends first.
"""

import json
import os
import select
import shutil
import signal
import sys
from typing import Dict

__all__ = ["PROXY_DIR_ENV", "OWNER_ENV", "ENVIRONMENT_FILE", "DONE_FILE", "RANK_PREFIXES", "rank_environment"]

PROXY_DIR_ENV = "HVDPLUS_PROXY_DIR"
OWNER_ENV = "HVDPLUS_PROXY_OWNER"
ENVIRONMENT_FILE = "environment.json"
DONE_FILE = "done"
# The variables that make a process the rank: Open MPI's and its runtime's, and hvdplus' own
# (HVDPLUS_NODE_ID among them).
RANK_PREFIXES = ("PMIX_", "OMPI_", "PRTE_", "OPAL_", "HVDPLUS_")
_POLL_INTERVAL_S = 0.1


def rank_environment(environ: Dict[str, str]) -> Dict[str, str]:
    """The variables of `environ` that the rank's owner takes over."""
    return {name: value for name, value in environ.items() if name.startswith(RANK_PREFIXES)}


def write_environment(folder: str, variables: Dict[str, str]) -> None:
    """Write `variables` as JSON into `folder`, whole or not at all (the worker polls for it)."""
    path = os.path.join(folder, ENVIRONMENT_FILE)
    with open(path + ".tmp", "w") as file:
        json.dump(variables, file)
    os.replace(path + ".tmp", path)


def wait_for_done(folder: str, owner: int) -> bool:
    """Wait until `folder` holds the done file (True) or process `owner` has ended (False)."""
    try:
        owner_handle = os.pidfd_open(owner)
    except ProcessLookupError:
        return False
    try:
        while not os.path.exists(os.path.join(folder, DONE_FILE)):
            # A process descriptor turns readable when its process ends.
            if select.select([owner_handle], [], [], _POLL_INTERVAL_S)[0]:
                return os.path.exists(os.path.join(folder, DONE_FILE))
        return True
    finally:
        os.close(owner_handle)


def main() -> int:
    folder, owner = os.environ[PROXY_DIR_ENV], int(os.environ[OWNER_ENV])
    # mpirun ends a job with SIGTERM: end through `finally`, which removes the folder.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        write_environment(folder, rank_environment(dict(os.environ)))
        return 0 if wait_for_done(folder, owner) else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
