"""The slow preparations some tests need, made in the background while other tests run.

Building a container image or a virtual environment from the package index takes from ten
seconds to over a minute on a fresh machine, most of it spent waiting on the network and the
disk, while the test in front of it waits too. So when a session has collected its tests, it
starts the preparations they will need (tests/conftest.py), one after another in one thread,
at the lowest CPU priority: they use the time a core is idle, and the tests that run meanwhile
slow down only a little (5 to 10 % for the first few minutes of a fresh machine's run). The
tests that need one run last (conftest's ordering), and their fixture waits for it, or starts
it then, where the session did not.

A preparation that fails raises its error in every fixture that waits for it, as it would
have had the fixture made it itself.
"""

import concurrent.futures
import os
import queue
import threading

from testkit import cluster, kubernetes_pods, mpich, oldest_python, slurm_cluster

__all__ = ["PREPARATIONS", "result", "start_needed", "start_needed_on_first_use"]

# Each preparation by the name of the fixture that waits for it, in the order they start: the
# environments first, as their tests come before the containers'; the Kubernetes and Slurm
# images are built over the test image, which cluster.build_image makes once a process.
PREPARATIONS = {
    "mpich_python": lambda folders: mpich.mpich_python_or_skip_reason(str(folders.mktemp("mpich"))),
    "oldest_venv": lambda folders: oldest_python.build_venv(folders.mktemp("oldest-python")),
    "container_image": lambda folders: cluster.build_image(),
    "kubernetes_image": lambda folders: kubernetes_pods.build_image(),
    "slurm_image": lambda folders: slurm_cluster.build_image(),
}

_lock = threading.Lock()
_started = {}
_deferred = []  # (fixture names, folders) to start once a preparation is first asked for
_queue = queue.SimpleQueue()
_worker = None


def _work():
    # Linux gives each thread its own nice value, and the processes it starts inherit it.
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    while True:
        name, folders, future = _queue.get()
        try:
            future.set_result(PREPARATIONS[name](folders))
        except BaseException as error:  # the fixture that waits raises it
            future.set_exception(error)


def _start(name, folders):
    global _worker
    with _lock:
        if name not in _started:
            if _worker is None:
                # A daemon: a session that ends early (-x, Ctrl-C) does not wait for a build.
                _worker = threading.Thread(target=_work, name="hvdplus-prepare", daemon=True)
                _worker.start()
            _started[name] = concurrent.futures.Future()
            _queue.put((name, folders, _started[name]))
        return _started[name]


def start_needed(fixture_names, folders):
    """Start, in PREPARATIONS' order, each preparation whose fixture is among `fixture_names`.
    `folders` is the session's tmp_path_factory."""
    for name in PREPARATIONS:
        if name in fixture_names:
            _start(name, folders)


def start_needed_on_first_use(fixture_names, folders):
    """Like start_needed, but only once some test asks for a preparation: under pytest-xdist
    every worker collects every test, and only the one that runs the tests needing them
    (conftest's "prepared" group) should build."""
    _deferred.append((fixture_names, folders))


def result(name, folders):
    """What preparation `name` gave, once it is done (started now where it was not)."""
    while _deferred:
        start_needed(*_deferred.pop())
    return _start(name, folders).result()
