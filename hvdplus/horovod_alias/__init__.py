"""Where Horovod's module names resolve to hvdplus: `PATH` holds a `horovod` package whose
modules are hvdplus's (`import horovod.torch as hvd` gives `hvdplus.torch`).

Nothing puts `PATH` on the import path by itself: `horovodrun` and `hvdplusrun
--horovod-compat` put it on the ranks' `PYTHONPATH` when no real Horovod is installed, and
a user of plain `mpirun` can do the same. A real Horovod always wins: the launchers leave
the alias out where one is installed, and the alias refuses to load where one is
importable beside it. This module imports nothing from hvdplus, so the launcher (which
never imports MPI) may read `PATH`.
"""

import importlib.machinery
import os
import sys
from typing import Optional

__all__ = ["PATH", "real_horovod"]

PATH = os.path.dirname(os.path.abspath(__file__))


def real_horovod(search_path=None) -> Optional[str]:
    """The folder of an installed Horovod on `search_path` (default: sys.path) that is not
    this alias, or None."""
    for entry in search_path if search_path is not None else sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == PATH:
            continue
        spec = importlib.machinery.PathFinder.find_spec("horovod", [folder])
        if spec is not None and spec.submodule_search_locations:
            return os.path.join(folder, "horovod")
    return None
