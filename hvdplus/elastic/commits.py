"""Commits on the local disk of each host, so that a job that restarts resumes from them.

Every rank of a data-parallel job holds the same commit in memory (each rank saves its own
values, and the ranks' values agree after every sync and every step), so a job across hosts
holds each commit on all of them. What a process's death takes with it is that memory: when
a host is lost, Open MPI ends every rank, and a job that restarts has only disks left. So one
rank of each host (its local rank 0) writes every commit to a folder on that host, in a
thread of its own while training goes on, and a restarted job resumes from the newest commit
that any of its hosts holds (`State.sync`). No folder is shared between hosts.

The folder is the path of the launcher's job folder (HVDPLUS_ELASTIC_DIR) followed by
`commits`: on the launcher's host it goes when the launcher ends; on other hosts, which the
launcher cannot reach, what remains is the last commit of each state.

Each state has two files, which take turns (HostCommits): a header with the commit number,
then the pickled copies of its values (arrays, as the handlers' snapshots give them, are
written from their own memory).
"""

import atexit
import os
import pickle
import struct
import tempfile
import threading
from typing import Any, Optional, Tuple

__all__ = ["HostCommits", "SharedCommits", "host_folder"]

_HEADER = struct.Struct("<16sQ")
_MAGIC = b"hvdplus-commit\x00\x02"
_SLOTS = ("a", "b")


def host_folder(job_folder: str) -> str:
    """This host's commit folder for the job whose launcher keeps `job_folder`. Processes that
    hvdplus counts as nodes of their own on one machine (HVDPLUS_NODE_ID, as on Ray) each keep
    a folder of their own: each node has a writer, and two must not share files."""
    folder = os.path.join(job_folder, "commits", *_node_folder())
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        # The launcher's temporary folder may lie where this host lets no one write.
        folder = os.path.join(tempfile.gettempdir(), os.path.basename(job_folder.rstrip(os.sep)), "commits",
                              *_node_folder())
        os.makedirs(folder, exist_ok=True)
    return folder


def _node_folder() -> list:
    node = os.environ.get("HVDPLUS_NODE_ID")
    return ["node-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in node)] if node else []


class HostCommits:
    """The commits of one state in this host's folder, one write at a time, in the background.

    Two files take turns: each write goes into the one that holds the older commit, over its
    pages. Writing over a file's pages costs a few milliseconds where a new file of the same
    size costs several times that (the kernel allocates its pages and frees the old file's),
    and a write never touches the newest commit. A file's header, with its commit number, is
    cleared before its values are written and set after, so a process killed while writing
    leaves a file that counts as empty, beside the newest commit."""

    def __init__(self, folder: str, index: int):
        self.paths = [os.path.join(folder, f"state-{index}.{slot}.commit") for slot in _SLOTS]
        self._writing: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        # A process that ends normally finishes the write it started: the commit is worth having.
        atexit.register(self._finish)

    def newest(self) -> int:
        """The number of the newest commit on disk; 0 when there is none."""
        return max(_number_in(path) for path in self.paths)

    def read(self) -> Optional[Tuple[int, Any]]:
        """(commit number, snapshot) of the newest commit on disk, or None."""
        for number, path in sorted(((_number_in(path), path) for path in self.paths), reverse=True):
            if number == 0:
                break
            try:
                with open(path, "rb") as file:
                    file.seek(_HEADER.size)
                    snapshot = pickle.load(file)
            except (OSError, EOFError, pickle.UnpicklingError):
                continue
            if _number_in(path) == number:  # else a writer on this host took the file meanwhile
                return number, snapshot
        return None

    def write_in_background(self, number: int, snapshot: Any) -> None:
        """Start writing commit `number`. `snapshot` must not change until `wait()` returns."""
        self.wait()
        self._writing = threading.Thread(target=self._write, args=(number, snapshot),
                                         name="hvdplus-commit-writer", daemon=True)
        self._writing.start()

    def write(self, number: int, snapshot: Any) -> None:
        self.wait()
        self._write(number, snapshot)
        self._raise_error()

    def wait(self) -> None:
        """Wait for the write in progress, if any; raise what it failed with."""
        if self._writing is not None:
            self._writing.join()
            self._writing = None
        self._raise_error()

    def _finish(self) -> None:
        if self._writing is not None:
            self._writing.join()

    def _write(self, number: int, snapshot: Any) -> None:
        path = min(self.paths, key=_number_in)
        try:
            with open(path, "r+b" if os.path.exists(path) else "w+b") as file:
                file.write(_HEADER.pack(_MAGIC, 0))
                file.flush()
                # Pickled straight into the file: protocol 5 writes large arrays from their
                # own memory, with no copy of the whole state on the way.
                pickle.dump(snapshot, file, protocol=5)
                file.truncate()
                file.seek(0)
                file.write(_HEADER.pack(_MAGIC, number))
            # No fsync: what a commit on disk guards against is the death of processes, whose
            # writes the kernel keeps; a host that crashes is lost to the job, disk and all.
        except BaseException as error:  # noqa: BLE001 - raised in the training thread by wait()
            self._error = error

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise OSError(f"hvdplus: could not write a commit to {self.paths[0]}: {error}") from error


def _number_in(path: str) -> int:
    """The number of the commit the file at `path` holds whole; 0 for none."""
    try:
        with open(path, "rb") as file:
            magic, number = _HEADER.unpack(file.read(_HEADER.size))
    except (FileNotFoundError, struct.error):
        return 0
    return number if magic == _MAGIC else 0


class SharedCommits(HostCommits):
    """The commits of one state in a folder that every host shares (HVDPLUS_COMMIT_DIR), which
    one rank writes. A requeued job may start on other hosts and read it at any moment, so each
    commit goes into a new file, flushed to storage, then renamed over the last one: the folder
    always holds one whole commit, never a half-written one."""

    def __init__(self, folder: str, index: int):
        os.makedirs(folder, exist_ok=True)
        super().__init__(folder, index)
        self.paths = [os.path.join(folder, f"state-{index}.commit")]

    def _write(self, number: int, snapshot: Any) -> None:
        path = self.paths[0]
        partial = f"{path}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as file:
                file.write(_HEADER.pack(_MAGIC, number))
                pickle.dump(snapshot, file, protocol=5)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)
            folder = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(folder)  # the rename itself, on storage
            finally:
                os.close(folder)
        except BaseException as error:  # noqa: BLE001 - raised in the training thread by wait()
            self._error = error
