"""The launch agent through which mpirun starts its daemons inside Ray actors.

mpirun runs `agent <host> <daemon command...>` once per host, as it would run ssh
(`--prtemca plm_ssh_agent`). Each "host" is a Ray actor (hvdplus.ray.executor). The agent
hands the command to the driver, which asks that actor to run it, and lives as long as the
daemon does, ending with its status, as an ssh session would. The two talk through named
pipes in a folder of the driver's (HVDPLUS_RAY_CHANNEL): no port is opened.

    python -m hvdplus.ray.agent HOST COMMAND...
"""

import json
import os
import sys

CHANNEL_ENV = "HVDPLUS_RAY_CHANNEL"
REQUESTS = "requests"


def main(argv) -> int:
    words = list(argv)
    while words and words[0].startswith("-"):  # options mpirun means for ssh (-x)
        words.pop(0)
    host, command = words[0], words[1:]
    channel = os.environ[CHANNEL_ENV]
    tag = f"{host}.{os.getpid()}"
    reply = os.path.join(channel, f"reply.{tag}")
    os.mkfifo(reply)
    request = os.path.join(channel, f"request.{tag}.json")
    with open(request + ".tmp", "w") as file:
        json.dump({"host": host, "command": " ".join(command), "reply": reply}, file)
    os.replace(request + ".tmp", request)
    # One short line, written at once, however many agents write beside it.
    with open(os.path.join(channel, REQUESTS), "w") as requests:
        requests.write(request + "\n")
    with open(reply) as answer:
        status = answer.read().strip()
    os.unlink(reply)
    return int(status) if status.lstrip("-").isdigit() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
