"""What `hvdplus agent` (pod_agent) and the pods that talk to it (pod_connect, launcher_finished)
say to each other, after both have proved that they hold the job's key
(hvdplus.common.secure_channel).

The peer's first message is a kind and its data:
- RUN + a command: the agent runs it with /bin/sh and answers with OUTPUT + bytes as they come,
  then EXIT + its status (STATUS);
- LAUNCHER_FINISHED (no data): pod 0's launcher has exited 0, so the agent stops serving and
  exits 0 once its running commands have ended; it answers EXIT + 0 first.
"""

import struct

from ..common.keyed_handshake import HandshakeRoles

__all__ = ["ROLES", "NAME", "RUN", "LAUNCHER_FINISHED", "OUTPUT", "EXIT", "STATUS", "MAX_COMMAND_BYTES",
           "HANDSHAKE_SECONDS", "READ_BYTES"]

ROLES = HandshakeRoles(server=b"hvdplus pod agent", client=b"hvdplus pod launcher")
NAME = "the hvdplus agent's session"
# What a peer asks of an agent.
RUN, LAUNCHER_FINISHED = b"R", b"F"
# What the agent answers: output, then a status.
OUTPUT, EXIT = b"O", b"X"
STATUS = struct.Struct("!i")
# The longest command a launcher may send (mpirun's daemon command lines are a few KiB).
MAX_COMMAND_BYTES = 1 << 20
# A peer that has not ended its handshake within this long is dropped, however it trickles.
HANDSHAKE_SECONDS = 5.0
READ_BYTES = 65536
