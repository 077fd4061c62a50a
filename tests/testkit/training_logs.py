"""Reading back the logs of tests/containers/resumable_training.py: which steps ran, how
often, at which job size; and the weights one process gets by replaying them."""

import collections
import glob
import json
import os
import re
import sys

import numpy as np

from testkit import cluster

sys.path.insert(0, os.path.join(cluster.REPO, "tests", "containers"))
from resumable_training import replay  # noqa: E402

__all__ = ["StepLog", "final_result", "read_step_log"]


class StepLog:
    """Every "ran <step> <size> <time>" line of every rank's log in a folder."""

    def __init__(self, lines):
        self.runs = collections.Counter()  # (step, size) -> how many ranks ran it
        self.last_size = {}  # step -> the job size of its latest run
        latest = {}
        for line in lines:
            match = re.fullmatch(r"ran (\d+) (\d+) ([\d.]+)", line.strip())
            if match:
                step, size, when = int(match.group(1)), int(match.group(2)), float(match.group(3))
                self.runs[step, size] += 1
                if when >= latest.get(step, 0.0):
                    latest[step], self.last_size[step] = when, size

    def steps(self):
        return sorted({step for step, _ in self.runs})

    def times_run(self, step):
        """How many times `step` ran, as whole jobs: the ranks that ran it over its size."""
        return sum(count / size for (ran, size), count in self.runs.items() if ran == step)

    def sizes(self):
        """The job size of each step's latest run (the one committed), step by step."""
        return [self.last_size[step] for step in sorted(self.last_size)]

    def repeated(self):
        """The steps that ran more than once (work lost to a stop or a failure)."""
        return [step for step in self.steps() if self.times_run(step) > 1]

    def check_complete(self, steps):
        """AssertionError unless steps 0..steps-1 each ran."""
        assert self.steps() == list(range(steps)), f"steps run: {self.steps()}"

    def replayed_weights(self):
        return replay(self.sizes())


def read_step_log(folder):
    lines = []
    for path in glob.glob(os.path.join(folder, "*.log")):
        with open(path) as file:
            lines += file.read().splitlines()
    return StepLog(lines)


def final_result(output):
    """Rank 0's closing JSON line ({"weights": [...], "steps": N}) in a job's output."""
    for line in reversed(output.splitlines()):
        match = re.search(r"(\{\"weights\".*\})", line)
        if match:
            result = json.loads(match.group(1))
            result["weights"] = np.array(result["weights"])
            return result
    raise AssertionError(f"no result line in:\n{output[-4000:]}")
