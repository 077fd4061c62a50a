"""The slow preparations some tests need, made in the background while other tests run.

Building a container image or a virtual environment from the package index takes from ten
seconds to several minutes on a fresh machine, most of it spent waiting on the network and
the disk, while the test in front of it waits too. So when a session has collected its tests,
it starts the preparations they will need (tests/conftest.py), one after another in one
thread, at the lowest CPU priority: they use the time a core is idle, and the tests that run
meanwhile slow down only a little. The tests that need one run last (conftest's ordering), and
their fixture waits for it, or starts it then, where the session did not. A fixture that has to
wait gives the preparation back the normal priority, where the user may: beside two busy tests the
lowest priority gets about one percent of a core, and the waiting test is idle.

Each is made once per run, whatever the number of pytest-xdist workers: a file lock in the
folder the run's workers share lets one make it while any other waits, and what it gave is
written there for the others to read. A preparation that failed raises its error in each
fixture of that process that waits for it, as it would have had the fixture made it itself;
another worker that asks tries it again.
"""

import concurrent.futures
import fcntl
import importlib
import json
import os
import queue
import threading
from pathlib import Path

__all__ = ["PREPARATIONS", "result", "start_needed"]


def _call(module, function, *args):
    # The builders' modules are imported as a preparation starts: conftest imports this file in
    # environments without what they import (the oldest Python's has no yaml).
    return getattr(importlib.import_module(f"testkit.{module}"), function)(*args)


# Each preparation by the name of the fixture that waits for it, in the order they start, given
# a folder of its own; what it returns is JSON (lists come back as tuples). The environments come
# first, as their tests come before the containers'; the Kubernetes and Slurm images are built
# over the test image.
PREPARATIONS = {
    "mpich_python": lambda folder: _call("mpich", "mpich_python_or_skip_reason", str(folder)),
    "oldest_venv": lambda folder: _call("oldest_python", "build_venv", folder),
    "container_image": lambda folder: _call("cluster", "build_image"),
    "kubernetes_image": lambda folder: _call("kubernetes_pods", "build_image"),
    "slurm_image": lambda folder: _call("slurm_cluster", "build_image"),
}

_lock = threading.Lock()
_started = {}
_queue = queue.SimpleQueue()
_worker = None
LOWEST_PRIORITY = 19
RAISE_PRIORITY_EVERY_SECONDS = 5


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
    thread_id = threading.get_native_id()
    while True:
        name, shared, future = _queue.get()
        # Each preparation starts at the lowest priority, whatever a waiting fixture gave the last.
        # Linux gives each thread its own nice value, and the processes it starts inherit it.
        os.setpriority(os.PRIO_PROCESS, thread_id, LOWEST_PRIORITY)
        # Where any worker's fixture finds it, to raise its priority (_give_normal_priority).
        (shared / f"preparer-{os.getpid()}-{thread_id}").touch()
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


def _threads_started_by(pid, thread_id):
    """The thread ids of every process that thread `thread_id` of process `pid` started, and
    of theirs in turn: Linux lists a thread's children in /proc/PID/task/TID/children."""
    found, waiting = [], [(pid, thread_id)]
    while waiting:
        pid, thread_id = waiting.pop()
        try:
            children = Path(f"/proc/{pid}/task/{thread_id}/children").read_text().split()
        except OSError:  # ended meanwhile, or a kernel without the list
            continue
        for child in map(int, children):
            try:
                threads = [int(name) for name in os.listdir(f"/proc/{child}/task")]
            except OSError:
                continue
            found += threads
            waiting += [(child, thread) for thread in threads]
    return found


def _give_normal_priority(shared: Path):
    """Every worker's preparations thread, and what each runs now, back at the priority of the
    tests: the preparation a fixture waits for may be another worker's to make."""
    preparers = [tuple(map(int, path.name.split("-")[1:])) for path in shared.glob("preparer-*-*")]
    for thread_id in [thread for pid, tid in preparers for thread in (tid, *_threads_started_by(pid, tid))]:
        try:
            if os.getpriority(os.PRIO_PROCESS, thread_id) > 0:
                os.setpriority(os.PRIO_PROCESS, thread_id, 0)
        except OSError:  # ended meanwhile, or raising a priority needs a privilege the user lacks
            pass


def result(name, shared: Path):
    """What preparation `name` gave, once it is done (started now where it was not)."""
    future = _start(name, shared)
    while not future.done():
        # Again while it waits: a preparation started meanwhile begins at the lowest priority.
        _give_normal_priority(shared)
        concurrent.futures.wait([future], timeout=RAISE_PRIORITY_EVERY_SECONDS)
    return future.result()
