"""The background thread that owns MPI once hvdplus is initialized.

Callers on any thread `submit` named operations and get a `Handle`. The engine thread
sends each rank's new requests to rank 0, whose `Coordinator` answers every rank with
the same ordered list of batches once all ranks have submitted a name; every rank then
runs those batches in that order.

The engine sequences its parts, each one concern: the `TensorQueue` (what this rank
submitted), the `ResponseCache` (names agreed before, sent as ids), the `ControlChannel`
(requests to rank 0, batches back), rank 0's `Coordinator` and `StallInspector`, and the
`ProgressPolicy` (when the thread looks again; it never spins). A caller that waits drives
the engine itself for a while (see `wait_for`).
"""

import contextlib
import sys
import threading
import time
import traceback
from typing import Any, List, Optional

from mpi4py import MPI

from ..comm.failures import a_peer_died_within, failed_ranks, is_process_failure
from ..comm.waiting import arrive_together
from ..common.backoff import Backoff
from ..common.errors import HvdplusError, RanksFailedError, ShutdownError, StalledError, error_from_wire
from .autotune import Setting, TuningDriver
from .completion import Completions, for_name
from .control_channel import ControlChannel
from .executor import JOINED, execute_batch
from .fusion import FusionBuffer
from .handles import Handle
from .negotiation import Coordinator
from .progress_policy import HOUSEKEEPING_S, ProgressPolicy
from .protocol import Batch, Collective, Outcome, Request, Token
from .response_cache import ResponseCache
from .stall_inspector import StallInspector
from .tensor_queue import Entry, TensorQueue
from .timeline import Timeline, record_negotiation

__all__ = ["Entry", "Engine"]

_SHUTDOWN_WAIT_S = 10.0
# How long a caller blocked on a handle drives the engine itself before it sleeps.
_CALLER_SPIN_S = 0.005
# A batch released after nothing moved this long runs after the ranks meet (_held_too_long):
# by then the waiting ranks sleep between looks for longer than the meeting takes.
_HELD_S = 0.010
# Once nothing has moved for this long, a look at the engine first asks whether a step would
# find anything (a submission, a control message, a change of waiters) and takes one only then,
# or after _FULL_STEP_EVERY_S for the coordinator's stall checks: a full step costs ten times
# the look, and a rank waiting for a late peer looks a hundred times a second.
_CHEAP_LOOKS_AFTER_S = 0.002
_FULL_STEP_EVERY_S = 0.1
# After an error that is not a failure, how long MPI has to report a peer that died: a dead
# process on this host is known within milliseconds, one on another host within a second.
_DEATH_SHOWS_S = 2.0
# Looked up per submitted operation: a global name is cheaper than the enum's attribute.
_JOIN = Collective.JOIN


class Engine:
    """Owns the data communicator and the thread that drives the engine's parts."""

    def __init__(self, comm, settings, algorithms, overlap: bool = True, revoke_all=None):
        self.data_comm = comm
        # Revokes every communicator of the runtime when a peer dies (see comm.failures).
        self._revoke_all = revoke_all
        self.overlap = overlap
        self.algorithms = algorithms
        self.control = ControlChannel(comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.settings = settings
        self.coordinator = (
            Coordinator(self.size, settings.fusion_threshold_bytes, settings.cache_capacity,
                        release_on_demand=not overlap)
            if self.rank == 0 else None
        )
        self.timeline: Optional[Timeline] = None
        if settings.timeline_path and self.rank == 0:
            self.timeline = Timeline(settings.timeline_path, settings.timeline_mark_cycles)
        self._stalls = (StallInspector(settings.stall_check_seconds, settings.stall_shutdown_seconds)
                        if self.rank == 0 else None)
        self._fusion_buffer = FusionBuffer()
        self._lock = threading.Lock()  # guards the queue and what decides whether the thread sleeps
        self._wake = threading.Event()
        self._queue = TensorQueue(self.rank)
        self._completions = Completions(self._queue, self._lock)
        self._cache = ResponseCache()
        self._policy = ProgressPolicy(settings.cycle_time_ms, overlap)
        self._stop_requested = False
        self._finished = False
        self._callers_driving = 0
        self._waiters = 0
        self._told_waiting = False
        self._waiting_at_step = False
        self._last_step_at = 0.0
        self._sleeping_idle = False
        self._progress = threading.Lock()
        self._shutdown_sent = False
        self._peers_lost = False
        self._tuning = TuningDriver(settings, algorithms) if self.rank == 0 and settings.autotune else None
        self._thread = threading.Thread(target=self._run, name="hvdplus-engine", daemon=True)
        self._thread.start()

    # -- caller side ------------------------------------------------------------------
    def submit(self, request: Request, payload: Any, finish=None) -> Handle:
        """Queue an operation; ValueError if its name is already in flight on this rank.

        A busy engine thread picks the operation up within one cycle, so the operations a
        training step submits together are negotiated together, and a caller that waits on
        the handle at once drives the engine itself (see wait_for). An idle one is woken
        only where it has a core of its own (overlap): otherwise waking it makes it fight
        the submitting thread for the GIL and the core, which slows the training step, and
        its idle sleep is short enough to pick the operation up anyway (see _idle)."""
        handle = Handle(request.name, self, finish)
        with self._lock:
            if self._completions.failure is not None:
                raise for_name(self._completions.failure, request.name)
            self._queue.add(Entry(request, payload, handle))
            if self._sleeping_idle and self._policy.wakes_on_submit():
                self._sleeping_idle = False
                self._wake.set()
        return handle

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Write a timeline to `path` from now on (rank 0 writes; other ranks ignore it), with
        cycles marked when `mark_cycles` or HVDPLUS_TIMELINE_MARK_CYCLES says so."""
        if self.rank == 0:
            marked = mark_cycles or self.settings.timeline_mark_cycles
            previous, self.timeline = self.timeline, Timeline(path, marked)
            if previous is not None:
                previous.close()

    def stop_timeline(self) -> None:
        timeline, self.timeline = self.timeline, None
        if timeline is not None:
            timeline.close()

    def stop(self) -> None:
        """Shut down on every rank: pending operations fail, the thread ends."""
        with self._lock:
            self._stop_requested = True
        self._wake.set()
        self._thread.join(timeout=_SHUTDOWN_WAIT_S + 5)
        self.stop_timeline()
        if not self._peers_lost:
            self.control.free()

    @property
    def control_comm(self):
        """The communicator of the engine's control messages (revoked with the others when a
        peer dies)."""
        return self.control.comm

    @property
    def peers_lost(self) -> bool:
        """Whether a peer died: the engine has stopped and its communicators are revoked."""
        return self._peers_lost

    def abandon(self) -> None:
        """Stop at once on this rank alone, after a peer died: no shutdown is negotiated, and
        the revoked communicators are left to MPI (freeing one would wait for the dead)."""
        self._peers_lost = True
        with self._lock:
            self._finished = True
            self._stop_requested = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=_SHUTDOWN_WAIT_S)
        self._completions.fail_everything(RanksFailedError("hvdplus re-formed the job before this operation completed"))
        self.stop_timeline()

    # -- engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        with self._failing_aborts_the_job():
            while not self._finished:
                # A caller blocked in wait() may be driving already: then sleep until its step
                # ends rather than look every cycle. Waking each millisecond beside a long
                # collective, where ranks outnumber cores, slowed it down many times over.
                if self._progress.acquire(timeout=HOUSEKEEPING_S):
                    try:
                        self._policy.note_step(self._step_unless_nothing_new())
                    finally:
                        self._progress.release()
                if not self._finished:
                    self._idle()
            if not self._peers_lost:
                self.control.finish_shutdown(self.coordinator, self._shutdown_sent, _SHUTDOWN_WAIT_S)

    @contextlib.contextmanager
    def _failing_aborts_the_job(self):
        try:
            yield
        except BaseException as exc:  # never die silently: the other ranks would wait forever
            if self.settings.ulfm and (is_process_failure(exc) or self._a_peer_died()):
                self._lose_peers()
                return
            traceback.print_exc()
            self._completions.fail_everything(HvdplusError(f"hvdplus engine failed on rank {self.rank}: {exc!r}"))
            sys.stderr.write(f"hvdplus: engine failure on rank {self.rank}; aborting the job\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)

    def wait_for(self, handle: Handle) -> None:
        """Return once `handle` is done.

        Handing work to a sleeping thread and back costs two thread wake-ups, far more than
        a small all-reduce takes; so a caller that would block anyway first runs engine steps
        itself for a while, with a `Backoff` between steps (yielding the core at first, then
        sleeping ever longer while nothing moves), and only then sleeps until the engine
        thread is done."""
        with self._waiting():
            self._drive_until(handle, _CALLER_SPIN_S)
            self._completions.wait_until_done(handle)

    def poll(self, handle: Handle) -> bool:
        """Whether `handle` is done, after one engine step taken as a waiting caller (so
        that collectives held for a waiter are released to a caller that polls)."""
        if not handle.done():
            with self._waiting():
                self._drive_until(handle, 0.0)
        return handle.done()

    @contextlib.contextmanager
    def _waiting(self):
        with self._lock:
            self._waiters += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiters -= 1

    def _drive_until(self, handle: Handle, spin_s: float) -> None:
        """Run engine steps on the calling thread until `handle` is done, for up to `spin_s`
        (at least one step)."""
        deadline = time.monotonic() + spin_s
        with self._lock:
            self._callers_driving += 1
        try:
            first = True
            backoff = Backoff()
            with self._failing_aborts_the_job():  # around the loop: once, not per step
                while not handle.done() and not self._finished and (first or time.monotonic() < deadline):
                    first = False
                    # While the engine thread runs a step, sleep on the lock rather than spin:
                    # on a node whose cores all train, a spinning caller halves that step's core.
                    # The caller pauses holding the lock, so that the engine thread sleeps on it
                    # meanwhile rather than take steps of its own beside the caller's.
                    if self._progress.acquire(timeout=max(deadline - time.monotonic(), 0.001)):
                        try:
                            moved = self._step_unless_nothing_new()
                            self._policy.note_step(moved)
                            if moved:  # a peer answered: the next answer comes as quickly
                                backoff = Backoff()
                            elif not handle.done() and time.monotonic() < deadline:
                                backoff.pause()
                        finally:
                            self._progress.release()
        finally:
            with self._lock:
                self._callers_driving -= 1
        if not handle.done():
            self._wake.set()

    def _step_unless_nothing_new(self) -> bool:
        """An engine step, unless a cheap look shows it would find nothing (see
        _CHEAP_LOOKS_AFTER_S); whether anything moved."""
        if self._nothing_new():
            return False
        self._last_step_at = time.monotonic()
        return self._step()

    def _nothing_new(self) -> bool:
        if (self._policy.still_for_s() < _CHEAP_LOOKS_AFTER_S
                or time.monotonic() - self._last_step_at >= _FULL_STEP_EVERY_S):
            return False
        with self._lock:
            if self._queue.has_submitted() or self._stop_requested or bool(self._waiters) != self._waiting_at_step:
                return False
        return self.control.nothing_arrived()

    def _step(self) -> bool:
        """One round of send, coordinate, receive, execute; whether anything moved (requests
        sent or arrived, batches agreed or run)."""
        self._waiting_at_step = bool(self._waiters)
        outgoing = self._drain_submissions()
        moved = bool(outgoing)
        if self.coordinator is not None:
            self.coordinator.add(0, outgoing)
            if self._waiters:
                self.coordinator.mark_waiting(0)
            else:
                self.coordinator.waiting.discard(0)
            moved |= self._receive_requests()
            batches = self.coordinator.take_batches()
            batches += self._stalls.batches(self.coordinator)
            if self.coordinator.shutdown_ranks:
                batches.append(Batch(Outcome.SHUTDOWN, value=min(self.coordinator.shutdown_ranks)))
            if self._tuning is not None and (move := self._tuning.take_move()) is not None:
                batches.insert(0, move)
            together = self._held_too_long(batches)
            if batches and self.size > 1:
                wire = [batch.known_ids or batch for batch in batches]
                self.control.send_batches([Token.ARRIVE_TOGETHER, *wire] if together else wire)
            if batches and (timeline := self.timeline) is not None:
                timeline.mark_cycle_start()
            if together:
                arrive_together(self.data_comm)
            self._finished |= self._execute(batches)
            if self._tuning is not None:
                self._tuning.score(batches, self.coordinator)
            moved |= bool(batches)
        else:
            if outgoing:
                self.control.send_requests(outgoing)
            while not self._finished and (wire := self.control.next_batches()) is not None:
                moved = True
                if wire and wire[0] is Token.ARRIVE_TOGETHER:
                    wire = wire[1:]
                    arrive_together(self.data_comm)
                self._finished |= self._execute([self._cache.batch(item) for item in wire])
        self.control.test_sends()
        return moved

    def _held_too_long(self, batches: List[Batch]) -> bool:
        """Whether the ranks should meet before running `batches`: after a long wait for a
        late rank, the others notice rank 0's answer up to one sleep of their backoff apart,
        and a collective's MPI waits would spin meanwhile. Only batches with a collective
        in them, which every rank runs anyway, so the meeting can hang no one."""
        return (self.size > 1
                and any(not isinstance(batch.kind, Outcome) and batch.error is None for batch in batches)
                and self._policy.still_for_s() >= _HELD_S)

    def _drain_submissions(self) -> list:
        with self._lock:
            entries = self._queue.take_submitted()
            stop = self._stop_requested and not self._shutdown_sent
            if stop:
                self._shutdown_sent = True
            waiting = self._waiters > 0
        outgoing = [self._outgoing_item(entry) for entry in entries]
        if self.coordinator is None and waiting != self._told_waiting:
            # Rank 0 hears that this rank waits (or no longer does) before its new requests.
            self._told_waiting = waiting
            outgoing.insert(0, Token.WAITING if waiting else Token.NOT_WAITING)
        if stop:
            outgoing.append(Token.SHUTDOWN)
        return outgoing

    def _outgoing_item(self, entry: Entry):
        """The request itself, or its response-cache id when it is unchanged since agreed."""
        return Token.JOIN if entry.request.kind is _JOIN else self._cache.outgoing(entry.request)

    def _receive_requests(self) -> bool:
        """Hand the requests that arrived to the coordinator; whether any did."""
        arrived = False
        for source, items in self.control.arrived_requests():
            self.coordinator.add(source, items)
            arrived = True
        return arrived

    def _idle(self) -> None:
        """Sleep until the next cycle, or until woken. Never poll faster: a thread that spins
        here takes the GIL and a core from the training loop; callers that wait on a handle
        poll for themselves (wait_for)."""
        with self._lock:
            idle = not self._queue and not self._stop_requested
            self._sleeping_idle = idle
            waiters = self._waiters
        if self._wake.wait(self._policy.sleep_s(idle, waiters)):
            self._wake.clear()
        with self._lock:
            self._sleeping_idle = False

    # -- executing agreed batches -----------------------------------------------------
    def _execute(self, batches: List[Batch]) -> bool:
        """Run `batches` in order; True if one of them shuts the engine down."""
        for batch in batches:
            finished = self._run_batch(batch)
            self._completions.notify()
            if finished:
                return True
        return False

    def _run_batch(self, batch: Batch) -> bool:
        """Run one agreed batch; True if it shuts the engine down."""
        if isinstance(batch.kind, Outcome):
            return self._run_outcome(batch)
        entries = [self._queue.get(name) for name in batch.names]
        if batch.error is not None:
            for entry in entries:
                if entry is not None:
                    self._completions.complete(entry.name, error=error_from_wire(batch.error))
            return False
        for name, cache_id in (batch.cache_ids or {}).items():
            entry = self._queue.get(name)
            if entry is not None:
                self._cache.remember(name, entry.request, cache_id)
        payloads = [entry.payload if entry is not None else JOINED for entry in entries]
        rows = None if (timeline := self.timeline) is None else timeline.of_kind(batch.kind)
        if rows is not None:
            record_negotiation(rows, batch, entries)
        results = execute_batch(self.data_comm, self.algorithms, batch, payloads, self._fusion_buffer, rows)
        for entry, result in zip(entries, results):
            if entry is not None:
                self._completions.complete(entry.name, result)
        return False

    def _run_outcome(self, batch: Batch) -> bool:
        if batch.kind is Outcome.SHUTDOWN:
            self._completions.fail_everything(ShutdownError(
                f"hvdplus was shut down (first by rank {batch.value}) before this operation "
                "completed on every rank"
            ))
            return True
        if batch.kind is Outcome.STALLED:
            self._completions.fail_everything(StalledError(batch.value))
            return True
        if batch.kind is Outcome.JOIN_DONE:
            self._completions.complete("__join__", batch.value)
            return False
        if batch.kind is Outcome.TUNE:
            self.retune(Setting(*batch.value))
            return False
        raise ValueError(f"unknown outcome {batch.kind!r}")

    # -- autotuning ------------------------------------------------------------------------
    def retune(self, setting: Setting) -> None:
        """Use `setting` from the next cycle on. The autotuner's moves reach every rank as
        TUNE batches; a caller of its own (benchmarks/autotune.py) calls this on every rank
        with no collective in flight, since the algorithm must change on all at once."""
        if self.coordinator is not None:
            self.coordinator.fusion_threshold = setting.fusion_bytes
        self._policy.set_cycle(setting.cycle_ms)
        if setting.algorithm is not None:
            self.algorithms.algorithm = setting.algorithm

    def tuned_setting(self) -> Optional[Setting]:
        """On rank 0 of an autotuned job, the setting the tuner chose, once it has; else None."""
        return self._tuning.chosen if self._tuning is not None else None

    def _a_peer_died(self) -> bool:
        """Whether a peer died around this error, which is then a result of that death."""
        try:
            return a_peer_died_within(self.data_comm, _DEATH_SHOWS_S)
        except MPI.Exception:
            return False

    def _lose_peers(self) -> None:
        """A peer died (or another rank saw one die and revoked the communicators): revoke
        them all, so no rank waits on the dead, and fail everything pending here."""
        failed = failed_ranks(self.data_comm)
        if self._revoke_all is not None:
            self._revoke_all()
        self._peers_lost = True
        self._finished = True
        self._completions.fail_everything(RanksFailedError.seen_on(self.rank, self.size, failed))
