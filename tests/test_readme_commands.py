"""The README's two commands for a fresh machine: `.ci/run` runs exactly the second."""

import os
import re

from testkit.mpi_jobs import REPO


def read(path):
    with open(os.path.join(REPO, path)) as file:
        return file.read()


def fresh_machine_commands():
    section = read("README.md").split("## Two commands for a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_the_readme_has_two_commands_and_ci_runs_the_second():
    demo, tests = fresh_machine_commands()
    assert "hvdplusrun -np 2 python examples/" in demo
    ci_lines = [line for line in read(".ci/run").splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines == [tests]
