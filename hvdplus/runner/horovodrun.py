"""`horovodrun`: Horovod's launcher command, running the job on hvdplus.

It takes Horovod's command line (see horovod_flags for the flags beyond hvdplusrun's) and
lets the ranks `import horovod.torch as hvd` and the like from hvdplus. Where a real
Horovod is installed, this command hands over to that Horovod's own launcher instead,
whichever package installed its `horovodrun` script last: hvdplus never shadows Horovod.
"""

import os
import sys
from typing import Optional, Sequence

from ..horovod_alias import real_horovod
from . import launch

__all__ = ["main"]

_REAL_LAUNCHER = "import sys; from horovod.runner.launch import run_commandline; sys.exit(run_commandline())"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if real_horovod() is not None:
        os.execv(sys.executable, [sys.executable, "-c", _REAL_LAUNCHER, *argv])
    return launch.main(argv, prog="horovodrun")


if __name__ == "__main__":
    sys.exit(main())
