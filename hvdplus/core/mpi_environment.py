"""Settings that Open MPI and its PMIx read once, when MPI starts, so they must be in the
environment before `mpi4py.MPI` is first imported (mpi4py starts MPI on import).

The package's import applies them (hvdplus/__init__.py): the adapters import mpi4py.MPI as they
load, so `import hvdplus.torch` has started MPI before any `hvd.init()` runs. A variable the user
set is left as it is.
"""

import os
import sys
from typing import MutableMapping, Optional

from . import slurm_steps

__all__ = ["prepare"]


def prepare(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Set the defaults below in `environ` (os.environ), unless MPI has started already."""
    environ = os.environ if environ is None else environ
    if "mpi4py.MPI" in sys.modules:
        return
    # hvdplus' shared-memory window is Open MPI's osc/sm business; its UCX component would
    # only print a failed-query error on machines without UCX networking.
    environ.setdefault("OMPI_MCA_osc", "^ucx")
    if slurm_steps.direct_step(environ) is not None:
        # Slurm's PMIx server offers security components that the PMIx inside Open MPI's wheel
        # lacks, and says so in a warning per rank; the plain one is what a job step needs.
        environ.setdefault("PMIX_MCA_psec", "native")
        # Open MPI 5.0's MPI_Init otherwise waits for the modex's fence before COMM_WORLD exists
        # in its point-to-point layer, and a message that arrives during that wait is matched
        # against the missing state: a segfault in mca_pml_ob1_recv_frag_callback_match
        # (open-mpi/ompi#12495), seen in the Slurm tests while other MPI jobs ran on the same
        # nodes. With the modex in the background, MPI_Init builds COMM_WORLD first and then
        # waits once, for that fence; Open MPI's main branch does so by default.
        environ.setdefault("OMPI_MCA_pmix_base_async_modex", "1")
