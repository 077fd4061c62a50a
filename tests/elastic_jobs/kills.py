"""The deaths the elastic test jobs plan (--kill RANK:STEP:PHASE): each one a SIGKILL of the
rank's own process at that committed step and phase, carried out once per job. A marker file
next to the job's output remembers it across restarts. The phase "first-sync" matches at any
step (the job has not synced its step yet there)."""

import os
import signal

import hvdplus


class Kills:
    def __init__(self, plans, out):
        self.plans = [plan.split(":") for plan in plans]
        self.out = out

    def planned(self, phase):
        return any(when == phase for *_, when in self.plans)

    def maybe(self, step, phase):
        for rank, at, when in self.plans:
            marker = f"{self.out}.killed-{rank}-{at}-{when}"
            if (when == phase and (phase == "first-sync" or int(at) == step) and hvdplus.rank() == int(rank)
                    and not os.path.exists(marker)):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
