"""Every module of hvdplus imports, in a fresh interpreter: the quick tier's floor.

`python -m pytest -m "not slow"` runs this beside the other fast tests, so a module that a
change broke at import fails the quick tier even where no fast test exercises it. The
modules are imported in one child process (so this process keeps its own state), with the
TensorFlow backend for Keras; `__main__` modules run a program when imported and are left out.
"""

import json
import os
import pkgutil
import subprocess
import sys

import hvdplus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def every_module():
    """The dotted name of every module and package under hvdplus, `__main__` modules aside."""
    names = ["hvdplus"]
    for module in pkgutil.walk_packages(hvdplus.__path__, prefix="hvdplus."):
        if not module.name.endswith(".__main__"):
            names.append(module.name)
    return sorted(names)


IMPORT_EACH = """
import importlib, json, sys, traceback
failures = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=3)
print(json.dumps(failures))
"""


def test_every_module_of_hvdplus_imports():
    modules = every_module()
    # Every layer and adapter is among them: a walk that found less would prove nothing.
    for package in ("common", "comm", "engine", "core", "elastic", "torch", "tensorflow", "keras", "runner",
                    "spark", "ray", "horovod_alias"):
        assert f"hvdplus.{package}" in modules
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, json.dumps(modules)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(f"{name}:\n{trace}" for name, trace in failures.items())
