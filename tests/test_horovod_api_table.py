"""docs/moving-from-horovod.md's tables of Horovod's names against the modules: every name a
row calls "same" exists under Horovod's module path, and every name a row calls "not yet" (if
any) does not, so the tables change when the modules do."""

import os
import re
import subprocess

import pytest

from hvdplus.horovod_alias import PATH as ALIAS_PATH

from testkit.programs import program

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "moving-from-horovod.md")


def table_rows(heading):
    """(first cell, names, status) of each row of the table under `heading`: the first
    cell's names, with names in parentheses given as attributes of the name before them
    ("elastic.run")."""
    text = open(DOC).read()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("name", "---"):
            continue
        names, parent, depth = [], None, 0
        for token in re.findall(r"`([^`]+)`|(\()|(\))", cells[0]):
            name, opening, closing = token
            depth += bool(opening) - bool(closing)
            if name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                names.append(f"{parent}.{name}" if depth and parent else name)
                if not depth:
                    parent = name
        rows.append((cells[0], names, cells[1]))
    return rows


def missing_names(module, names):
    """The names of `names` that `module`, imported as Horovod's programs import it, lacks."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ALIAS_PATH, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(program("report_missing_names", module, *names), capture_output=True, text=True,
                            env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def test_every_horovod_torch_name_in_the_table_exists():
    pytest.importorskip("torch")
    rows = table_rows("## `horovod.torch`, name by name")
    names = [name for _, row_names, _ in rows for name in row_names]
    assert len(names) > 60
    assert missing_names("horovod.torch", names) == []


@pytest.mark.parametrize("prefix, module", [("", "horovod.tensorflow"), ("Keras: ", "horovod.tensorflow.keras")])
def test_the_tensorflow_and_keras_tables_say_what_exists(prefix, module):
    pytest.importorskip("tensorflow")
    table = table_rows("## `horovod.tensorflow` and `horovod.tensorflow.keras`")
    rows = [(names, status) for cell, names, status in table if cell.startswith("Keras:") == (prefix == "Keras: ")]
    present = [name for names, status in rows if status.startswith("same") for name in names]
    absent = [name for names, status in rows if status.startswith("not yet") for name in names]
    assert present
    missing = missing_names(module, present + absent)
    assert [name for name in present if name in missing] == []
    assert [name for name in absent if name not in missing] == []
