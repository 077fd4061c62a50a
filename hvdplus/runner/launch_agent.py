"""The launch agent through which mpirun starts its daemons inside processes that another
system started: Ray actors (hvdplus.ray), Spark tasks (hvdplus.spark).

mpirun runs `agent <host> <daemon command...>` once per host, as it would run ssh
(`--prtemca plm_ssh_agent`). Each "host" is one such process. The agent hands the command to
the process that started mpirun (hvdplus.runner.agent_channel), which has the host's process
run it, and ends when that one answers, with the status it answers, as an ssh session would.
The two talk through named pipes in a folder of the starter's (HVDPLUS_AGENT_CHANNEL): no port
is opened.

    python -m hvdplus.runner.launch_agent HOST COMMAND...
"""

import json
import os
import sys

CHANNEL_ENV = "HVDPLUS_AGENT_CHANNEL"
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
