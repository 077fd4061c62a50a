"""How pod 0 of an Indexed Job tells the agents of the other pods that its launcher has exited 0,
so that they exit 0 too and the Job completes on every Kubernetes from 1.29, with or without
`successPolicy` (alpha in 1.30, off by default; without it a Job completes only once every index
has).

The notice is a LAUNCHER_FINISHED message over the same keyed session that mpirun's daemons are
started through (hvdplus.runner.pod_protocol): only a holder of the job's key can end an agent. A
launcher that fails is not announced: the Job's backoffLimit and podFailurePolicy decide.
"""

import socket
import sys
import threading
from typing import Dict, List, Sequence

from ..common.secure_channel import handshake_deadline, open_session
from . import pod_protocol as protocol

__all__ = ["NOTICE_TIMEOUT_S", "tell_agent", "tell_agents"]

# A pod that is gone (failed, evicted) does not answer: it needs no notice, and none waits long.
NOTICE_TIMEOUT_S = 10.0


def tell_agent(host: str, port: int, key: bytes, timeout: float = NOTICE_TIMEOUT_S) -> None:
    """Tell the agent at `host`:`port` that the launcher has finished; raise OSError (or
    ConnectionError) unless it proves it holds `key` and acknowledges.

    Args:
        host: the pod's host name.
        port: the agents' port.
        key: the job's key.
        timeout: seconds for the connection and for each answer.
    """
    with socket.create_connection((host, port), timeout=timeout) as connection:
        session = open_session(connection, key, protocol.ROLES, protocol.NAME,
                               handshake_deadline(protocol.HANDSHAKE_SECONDS))
        session.send(protocol.LAUNCHER_FINISHED)
        answer = session.receive(limit=1 + protocol.STATUS.size)
        if answer != protocol.EXIT + protocol.STATUS.pack(0):
            raise ConnectionError(f"{protocol.NAME}: {host} did not acknowledge the launcher's end")
        session.expect_end()


def tell_agents(hosts: Sequence[str], port: int, key: bytes, timeout: float = NOTICE_TIMEOUT_S) -> List[str]:
    """Tell every agent of `hosts` at once (tell_agent); the hosts that could not be told, each
    reported on standard error.

    Args:
        hosts: the other pods' host names.
        port: the agents' port.
        key: the job's key.
        timeout: seconds for each connection and answer.
    """
    errors: Dict[str, str] = {}

    def tell(host: str) -> None:
        try:
            tell_agent(host, port, key, timeout)
        except OSError as error:
            errors[host] = str(error) or type(error).__name__

    threads = [threading.Thread(target=tell, args=(host,), name="hvdplus-launcher-finished", daemon=True)
               for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for host, error in sorted(errors.items()):
        print(f"hvdplus agent: could not tell {host}'s agent that the launcher finished: {error}", file=sys.stderr,
              flush=True)
    return sorted(errors)
