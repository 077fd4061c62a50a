"""Outliving a dead rank with MPI's User-Level Failure Mitigation (ULFM).

Under Open MPI started with `--with-ft ulfm`, an operation that involves a dead process
fails with an `MPI.Exception` instead of ending the job. It fails only on the ranks that
talk to the dead one, so the first rank to see a failure revokes every communicator it
uses: each operation still pending on a revoked communicator fails on every rank, and no
rank is left waiting for a message that will never come. The survivors then agree on who
is gone and build a smaller communicator with `Shrink`.
"""

import time
from typing import Iterable, List

from mpi4py import MPI

__all__ = ["is_process_failure", "failed_ranks", "revoke", "shrink", "check_peers", "a_peer_died_within"]

_FAILURE_CLASSES = frozenset(
    getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name)
)
# No message is ever sent with this tag: probing for it only asks MPI whether a peer died.
_NEVER_SENT_TAG = 32000


def is_process_failure(exc: BaseException) -> bool:
    """Whether `exc` says a peer died or the communicator was revoked because one did."""
    return isinstance(exc, MPI.Exception) and exc.Get_error_class() in _FAILURE_CLASSES


def failed_ranks(comm: "MPI.Comm") -> List[int]:
    """The ranks of `comm` this process knows to be dead (a local call)."""
    try:
        failed = comm.Get_failed()
    except (MPI.Exception, NotImplementedError, AttributeError):
        return []
    try:
        if failed.Get_size() == 0:
            return []
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), comm.Get_group())
        return sorted(r for r in ranks if r != MPI.UNDEFINED)
    finally:
        failed.Free()


def revoke(comms: Iterable["MPI.Comm"]) -> None:
    """Revoke each live communicator of `comms`, so every rank's pending and future
    operations on it fail rather than wait for a dead peer."""
    for comm in comms:
        if comm is None or comm == MPI.COMM_NULL:
            continue
        try:
            if not comm.Is_revoked():
                comm.Revoke()
        except MPI.Exception:
            continue


def shrink(comm: "MPI.Intracomm") -> "MPI.Intracomm":
    """A new communicator of `comm`'s surviving ranks, in their old order (collective on
    the survivors; it tolerates ranks that die while it runs)."""
    revoke([comm])
    return comm.Shrink()


def check_peers(comm: "MPI.Comm") -> None:
    """Raise the MPI.Exception of a dead peer or a revoked `comm`, if there is one.

    Code that waits on shared memory rather than inside MPI calls this now and then: MPI
    hears of failures only while something calls into it."""
    comm.Iprobe(source=MPI.ANY_SOURCE, tag=_NEVER_SENT_TAG)


def a_peer_died_within(comm: "MPI.Comm", seconds: float) -> bool:
    """Whether MPI knows, or learns within `seconds`, that a peer of `comm` died.

    Open MPI's ULFM can complete a collective with a peer that died during it as if it
    had succeeded, with zeros where that peer's data belonged (seen as an object that
    would not unpickle). An error raised while a peer is dead is that death, and asking
    here, on the error's path only, costs nothing otherwise."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            check_peers(comm)
        except MPI.Exception as exc:
            if is_process_failure(exc):
                return True
            raise
        if failed_ranks(comm):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
