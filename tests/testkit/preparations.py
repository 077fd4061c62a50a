"""The slow preparations some tests need, made in the background while other tests run.

Building a container image or a virtual environment from the package index takes from ten
seconds to several minutes on a fresh machine, most of it spent waiting on the network and
the disk, while the test in front of it waits too. So when a session has collected its tests,
it starts the preparations they will need (tests/conftest.py), one after another in one
thread, at the lowest CPU priority: they use the time a core is idle, and the tests that run
meanwhile slow down only a little. The tests that need one run last (conftest's ordering), and
their fixture waits for it, or starts it then, where the session did not.

Each is made once per run, whatever the number of pytest-xdist workers: a file lock in the
folder the run's workers share lets one make it while any other waits, and what it gave is
written there for the others to read. A preparation that failed raises its error in each
fixture of that process that waits for it, as it would have had the fixture made it itself;
another worker that asks tries it again.
"""

import concurrent.futures
import fcntl
import json
import os
import queue
import threading
from pathlib import Path

from testkit import cluster, kubernetes_pods, mpich, oldest_python, slurm_cluster

__all__ = ["PREPARATIONS", "result", "start_needed"]

# Each preparation by the name of the fixture that waits for it, in the order they start, given
# a folder of its own; what it returns is JSON (lists come back as tuples). The environments come
# first, as their tests come before the containers'; the Kubernetes and Slurm images are built
# over the test image.
PREPARATIONS = {
    "mpich_python": lambda folder: mpich.mpich_python_or_skip_reason(str(folder)),
    "oldest_venv": lambda folder: oldest_python.build_venv(folder),
    "container_image": lambda folder: cluster.build_image(),
    "kubernetes_image": lambda folder: kubernetes_pods.build_image(),
    "slurm_image": lambda folder: slurm_cluster.build_image(),
}

_lock = threading.Lock()
_started = {}
_queue = queue.SimpleQueue()
_worker = None


def _made_once_per_run(name, shared: Path):
    made = shared / f"prepared-{name}.json"
    with open(shared / f"prepared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes, or the process ends
        if made.exists():
            value = json.loads(made.read_text())
        else:
            folder = shared / f"prepared-{name}"
            folder.mkdir(exist_ok=True)
            value = PREPARATIONS[name](folder)
            made.write_text(json.dumps(value))
    return tuple(value) if isinstance(value, list) else value


def _work():
    # Linux gives each thread its own nice value, and the processes it starts inherit it.
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    while True:
        name, shared, future = _queue.get()
        try:
            future.set_result(_made_once_per_run(name, shared))
        except BaseException as error:  # the fixture that waits raises it
            future.set_exception(error)


def _start(name, shared):
    global _worker
    with _lock:
        if name not in _started:
            if _worker is None:
                # A daemon: a session that ends early (-x, Ctrl-C) does not wait for a build.
                _worker = threading.Thread(target=_work, name="hvdplus-prepare", daemon=True)
                _worker.start()
            _started[name] = concurrent.futures.Future()
            _queue.put((name, shared, _started[name]))
        return _started[name]


def start_needed(fixture_names, shared: Path):
    """Start, in PREPARATIONS' order, each preparation whose fixture is among `fixture_names`.
    `shared` is the run's folder that its workers share (conftest's `run_folder`)."""
    for name in PREPARATIONS:
        if name in fixture_names:
            _start(name, shared)


def result(name, shared: Path):
    """What preparation `name` gave, once it is done (started now where it was not)."""
    return _start(name, shared).result()
