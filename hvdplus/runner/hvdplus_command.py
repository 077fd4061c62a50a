"""The `hvdplus` command: the tools that run beside a job rather than launch one.

    hvdplus agent [...]                   # in every pod of a Kubernetes job (pod_agent)
    hvdplus agent-connect HOST COMMAND    # mpirun's launch agent there, in place of ssh (pod_connect)
"""

import sys
from typing import Optional, Sequence

from . import pod_agent, pod_connect

__all__ = ["main"]

_SUBCOMMANDS = {"agent": pod_agent.main, "agent-connect": pod_connect.main}


def main(argv: Optional[Sequence[str]] = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] not in _SUBCOMMANDS:
        print(f"usage: hvdplus {{{','.join(_SUBCOMMANDS)}}} ...", file=sys.stderr)
        return 2
    return _SUBCOMMANDS[words[0]](words[1:])


if __name__ == "__main__":
    sys.exit(main())
