"""docs/design.md's adapter contract against the adapters: every module its table gives an
adapter exists, and every name it lists there is in that module's `__all__` and resolves, so
an adapter drops a name, or the page lists one an adapter lacks, only with a failure here.

The adapters are imported in a fresh interpreter with KERAS_BACKEND=tensorflow: hvdplus.keras
is checked on that backend only."""

import importlib
import json
import os
import re
import subprocess

import pytest

from testkit.programs import program

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "design.md")
ADAPTERS = ("torch", "tensorflow", "keras")
HOROVOD_SPLIT = ("mpi_ops", "functions", "optimizer", "compression", "elastic")


def _names(cell):
    """The backticked names of a cell; `<module>.__all__` stands for every name of that module."""
    names = []
    for token in re.findall(r"`([^`]+)`", cell):
        if token.endswith(".__all__"):
            names.extend(importlib.import_module(token[:-len(".__all__")]).__all__)
        else:
            names.append(token)
    return names


def contract_rows():
    """(module, {adapter: names}) for each row of the table under "## The adapter contract",
    module "" standing for the adapter package itself. An adapter a row gives no names has no
    such module by the contract."""
    section = open(DOC).read().split("\n## The adapter contract\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("module", "---"):
            continue
        assert len(cells) == 3, f"a row of the adapter contract needs three cells: {line}"
        module_cell, every_cell, own_cell = cells
        module = "" if module_cell == "package" else module_cell.strip("`")
        shared = _names(every_cell)
        names = {adapter: list(shared) for adapter in ADAPTERS} if shared else {}
        for part in filter(None, (part.strip() for part in own_cell.split(";"))):
            adapter, _, listed = part.partition(":")
            assert adapter in ADAPTERS, f"row {module_cell!r} names {adapter!r}, which is no adapter"
            names.setdefault(adapter, []).extend(_names(listed))
        assert names, f"row {module_cell!r} lists no names"
        rows.append((module, names))
    return rows


ROWS = contract_rows()
CASES = [(adapter, module, names[adapter]) for module, names in ROWS for adapter in ADAPTERS if adapter in names]


def module_path(adapter, module):
    return f"hvdplus.{adapter}" + (f".{module}" if module else "")


@pytest.fixture(scope="module")
def exports():
    """Each module the table names -> its exported names, or None where it does not exist."""
    modules = sorted({module_path(adapter, module) for adapter, module, _ in CASES})
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    result = subprocess.run(program("report_exports", *modules), capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_the_table_gives_every_adapter_horovods_modules_once():
    modules = [module for module, _ in ROWS]
    assert len(modules) == len(set(modules)), f"a module has two rows: {modules}"
    rows = dict(ROWS)
    for module in ("", *HOROVOD_SPLIT):
        assert sorted(rows.get(module, {})) == sorted(ADAPTERS), f"{module or 'package'}: {rows.get(module)}"


@pytest.mark.parametrize("adapter, module, names", CASES,
                         ids=[f"{adapter}-{module or 'package'}" for adapter, module, _ in CASES])
def test_the_adapter_exports_what_the_table_lists(exports, adapter, module, names):
    path = module_path(adapter, module)
    assert exports[path] is not None, f"docs/design.md's adapter contract lists {path}, which does not exist"
    missing = [name for name in names if name not in exports[path]]
    assert missing == [], f"{path} does not export {missing}, which docs/design.md's adapter contract lists"
