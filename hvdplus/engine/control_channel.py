"""The engine's messages between ranks, on a communicator of their own: each rank's new
requests (and tokens) go to rank 0, whose Coordinator answers every rank with the same
batches. Every send is nonblocking; those still in flight are tested each step and, at
shutdown, waited for within a bound, so none is left unmatched when the communicator is
freed and none waits forever on a rank that is gone."""

import time
from typing import Iterator, List, Optional, Tuple

from mpi4py import MPI

from ..common.backoff import Backoff
from .protocol import Token

__all__ = ["ControlChannel"]

_REQUEST_TAG = 101
_RESPONSE_TAG = 102
# Longest rank 0 waits for its responses to reach the workers (see send_batches).
_DELIVERY_WAIT_S = 0.5
_SHUTDOWN = Token.SHUTDOWN


class ControlChannel:
    """Rank 0's and the workers' ends of the engine's control messages.

    Args:
        comm: the job's (or process set's) communicator; the channel works on a duplicate.
    """

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._sends: List[MPI.Request] = []
        self._status = MPI.Status()

    # -- a worker's end -------------------------------------------------------------------
    def send_requests(self, items: list) -> None:
        self._sends.append(self.comm.isend(items, dest=0, tag=_REQUEST_TAG))

    def next_batches(self) -> Optional[list]:
        """Rank 0's next list of batches (as sent), or None when none has arrived."""
        if not self.comm.iprobe(source=0, tag=_RESPONSE_TAG):
            return None
        return self.comm.recv(source=0, tag=_RESPONSE_TAG)

    # -- rank 0's end ---------------------------------------------------------------------
    def arrived_requests(self) -> Iterator[Tuple[int, list]]:
        """(rank, its items) for every list of requests that has arrived."""
        status = self._status
        while self.size > 1 and self.comm.iprobe(source=MPI.ANY_SOURCE, tag=_REQUEST_TAG, status=status):
            source = status.Get_source()
            yield source, self.comm.recv(source=source, tag=_REQUEST_TAG)

    def send_batches(self, wire: list) -> None:
        """Send `wire` to every worker, and let it reach them before the batches run. A long
        response goes by rendezvous, which only moves while this rank is inside MPI; a
        shared-memory batch keeps it out of MPI until the workers join that batch, which they
        can only do once they have the response. Bounded, for a worker that is gone or stalled.
        Even a short response's send completes only once the worker reads it (Open MPI's
        shared-memory transport), and a worker that waited long reads it up to one sleep of its
        backoff later. Yielding throughout that time took most of rank 0's processor time while
        it waited for a late peer (5 % of a core at 4 ranks on 2 cores); a backoff of its own
        takes a few looks."""
        sends = [self.comm.isend(wire, dest=worker, tag=_RESPONSE_TAG) for worker in range(1, self.size)]
        self._sends.extend(unfinished(sends, _DELIVERY_WAIT_S, Backoff().pause))

    # -- both -----------------------------------------------------------------------------
    def nothing_arrived(self) -> bool:
        """Whether no message waits to be read at this end (rank 0: requests; a worker: rank
        0's batches), after testing the sends in flight. An Iprobe, a small part of a step."""
        self.test_sends()
        if self.rank == 0:
            return self.size == 1 or not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_REQUEST_TAG)
        return not self.comm.Iprobe(source=0, tag=_RESPONSE_TAG)

    def test_sends(self) -> None:
        if self._sends:
            self._sends = [request for request in self._sends if not request.Test()]

    def finish_sends(self, seconds: float) -> None:
        """Wait up to `seconds` for the sends still in flight."""
        self._sends = unfinished(self._sends, seconds, lambda: time.sleep(0.0005))

    def finish_shutdown(self, coordinator, sent: bool, seconds: float) -> None:
        """The shutdown handshake: every rank sends SHUTDOWN exactly once (`sent`: this one
        has) and rank 0 (whose `coordinator` is given) waits up to `seconds` for all of them,
        so no message is left unmatched when the communicator is freed."""
        if coordinator is None:
            if not sent:
                self.send_requests([_SHUTDOWN])
        else:
            deadline = time.monotonic() + seconds
            while len(coordinator.shutdown_ranks | {0}) < self.size and time.monotonic() < deadline:
                for source, items in self.arrived_requests():
                    coordinator.add(source, items)
                time.sleep(0.001)
        self.finish_sends(seconds)

    def free(self) -> None:
        self.comm.Free()


def unfinished(sends: List[MPI.Request], seconds: float, pause) -> List[MPI.Request]:
    """The requests of `sends` still incomplete after testing them for up to `seconds`,
    calling `pause()` between rounds."""
    deadline = time.monotonic() + seconds
    while sends:
        sends = [request for request in sends if not request.Test()]
        if not sends or time.monotonic() >= deadline:
            break
        pause()
    return sends
