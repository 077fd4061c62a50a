"""Point-to-point messages between two ranks of the job, on numpy arrays.

    if hvd.rank() == 0:
        hvd.send(activations, dst=1, tag=7)
    elif hvd.rank() == 1:
        activations = hvd.recv((32, 128), src=0, tag=7)            # float32 unless dtype=...
        hvd.recv(buffer, src=0, tag=7)                            # or into an array

Ranks (`dst`, `src`) are job ranks. With a `process_set`, this rank and the peer must
belong to it (ValueError otherwise); the set only checks membership, as messages always
travel on the job's own point-to-point communicator.

Every message carries its checks: the sender first sends a small header (dtype, shape,
tag), then the data; the receiver compares the header with the array it receives into
(or the shape and dtype it asked for) and answers with an acknowledgement, which carries
either OK or the error. A mismatch raises the same ValueError, naming both ranks, the tag
and both descriptions, on both ranks (the sender learns of it from the acknowledgement);
the receiving array's contents are then unspecified.

Semantics:
  * A send completes when its acknowledgement arrives, that is once the receiver has the
    data (as MPI_Ssend). Two ranks that both block in `send` to each other therefore
    deadlock: order the calls (one sends first, the other receives first), or start
    them with `send_async`/`recv_async` and wait for both.
  * Messages between the same pair of ranks with the same tag arrive in the order they
    were sent; messages with different tags are independent.
  * `send_async` and `recv_async` return a handle with `wait()` (returns the received
    array, or None for a send) and `poll()`; `hvdplus.synchronize(handle)` and
    `hvdplus.poll(handle)` work on it too. Messages progress whenever this process waits
    for or polls any point-to-point handle (all of its messages in flight move on then),
    not in the background: a receive that is started and never waited for holds up
    the sender's completion.
  * The async forms read (send) or write (recv) the array until the handle completes:
    leave it alone until then.
  * Tags run from 0 to `tag_limit()` (exclusive), 2**28 with Open MPI. The framework
    adapters send gradients (hvdplus.torch) on a channel of their own (`gradient=True`),
    which never meets the messages of the same tag.
  * A peer that dies, with MPI's failure mitigation on (hvdplusrun's elastic mode, see
    hvdplus.comm.failures), raises RanksFailedError; hvdplus' communicators are revoked,
    as when a collective sees a rank die.

The calls use nonblocking MPI on the calling thread (MPI runs at MPI_THREAD_MULTIPLE), on
a communicator of their own, away from the engine's collectives.
"""

import numbers
import threading
import weakref
from typing import Callable, Sequence, Union

import numpy as np

from ..comm.point_to_point import Link, Operation, Recv, Send, tag_text
from ..common.backoff import Backoff
from ..common.dtypes import check_supported
from . import runtime
from ..engine.handles import chained
from .process_sets import runtime_of

__all__ = ["send", "recv", "send_async", "recv_async", "tag_limit", "P2PHandle"]

_links = weakref.WeakKeyDictionary()  # a runtime's link, made on first use
_links_lock = threading.Lock()


def _link(job) -> Link:
    with _links_lock:
        link = _links.get(job)
        if link is None:
            link = _links[job] = Link(job.p2p_comm, _revoker(weakref.ref(job)))
        return link


def _revoker(job_ref) -> Callable[[], None]:
    """What a link calls when a peer died: revoke the runtime's communicators (with MPI's
    failure mitigation on), as a collective that sees a rank die does."""
    def revoke() -> None:
        job = job_ref()
        if job is not None and job.settings.ulfm:
            job.revoke()
    return revoke


def tag_limit() -> int:
    """Tags of point-to-point messages are below this (2**28 with Open MPI; MPI's minimum
    tag bound gives 4096)."""
    return _link(runtime.current("tag_limit()")).tag_limit


class P2PHandle:
    """A point-to-point message in flight: `wait()` returns the received array (None for a
    send) or raises the message's error; `poll()` says whether it is done, after moving
    every message in flight on. `then(step)` has wait() pass the result through `step`."""

    __slots__ = ("name", "_operation", "_finish")

    def __init__(self, operation: Operation):
        self.name = operation.what
        self._operation = operation
        self._finish = None

    def __repr__(self):
        return f"<hvdplus.P2PHandle {self.name!r} {'done' if self.done() else 'pending'}>"

    def then(self, step):
        self._finish = chained(self._finish, step)
        return self

    def done(self) -> bool:
        return self._operation.done

    def poll(self) -> bool:
        if not self._operation.done:
            self._operation.link.progress()
        return self._operation.done

    def wait(self):
        operation = self._operation
        backoff, steps = None, operation.steps_taken
        while not operation.done:
            operation.link.progress()
            if operation.done:
                break
            # A step taken means the peer is there and the next step follows at once: look
            # again as quickly as at first (MPI moves a large message only while looked at).
            if backoff is None or operation.steps_taken != steps:
                backoff, steps = Backoff(), operation.steps_taken
            backoff.pause()
        if operation.error is not None:
            raise operation.error
        return self._finish(operation.result) if self._finish is not None else operation.result


# -- arguments -----------------------------------------------------------------------------
def _arguments(peer, tag, process_set, role: str, what: str):
    """(the job runtime's link, the peer, the tag) after checking them; ValueError or
    TypeError naming `what` otherwise."""
    job = runtime.current(f"{what}()")
    link = _link(job)
    for label, value in ((role, peer), ("tag", tag)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{what}: {label} must be an int, got {type(value).__name__}")
    peer, tag = int(peer), int(tag)
    if not 0 <= peer < link.size:
        raise ValueError(f"{what}: {role} {peer} is out of range for a job of {link.size} ranks")
    if peer == link.rank:
        raise ValueError(f"{what}: {role} {peer} is this rank; a rank cannot message itself")
    if not 0 <= tag < link.tag_limit:
        raise ValueError(f"{what}: tag {tag} is out of range [0, {link.tag_limit})")
    if process_set is not None:
        runtime_of(process_set, what)  # this rank must be in the (added) set
        if process_set.process_set_id != 0 and peer not in process_set.ranks:
            raise ValueError(f"{what}: {role} rank {peer} is not in the process set {process_set.ranks}")
    return link, peer, tag


def _dtype(dtype, what: str) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32)
    try:
        result = np.dtype(dtype)
    except TypeError:
        if str(dtype) != "bfloat16":
            raise TypeError(f"{what}: dtype {dtype!r} is not a numpy dtype") from None
        import ml_dtypes

        result = np.dtype(ml_dtypes.bfloat16)
    check_supported(result, what)
    return result


def _receiving_array(array_or_shape, dtype, what: str) -> np.ndarray:
    if isinstance(array_or_shape, np.ndarray):
        array = array_or_shape
        check_supported(array.dtype, what)
        if dtype is not None and _dtype(dtype, what) != array.dtype:
            raise ValueError(f"{what}: dtype {dtype} differs from the array's {array.dtype}")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"{what}: the array to receive into must be C-contiguous and writeable")
        return array
    shape = (array_or_shape,) if isinstance(array_or_shape, numbers.Integral) else array_or_shape
    try:
        shape = tuple(shape)
        if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0 for n in shape):
            raise TypeError
    except TypeError:
        raise TypeError(f"{what}: expected a numpy array or a shape (a tuple of non-negative ints), "
                        f"got {array_or_shape!r}") from None
    return np.empty(tuple(int(n) for n in shape), dtype=_dtype(dtype, what))


# -- the calls -------------------------------------------------------------------------------
def send_async(array, dst: int, tag: int = 0, process_set=None, *, gradient: bool = False) -> P2PHandle:
    """Start sending `array` to job rank `dst`; the handle's wait() returns None once the
    receiver has it (or raises the receiver's mismatch error).

    Args:
        array: a numpy array (or anything np.asarray takes) of a supported dtype; copied
            only when it is not C-contiguous.
        dst: the receiving job rank (not this one).
        tag: tells apart messages between the same two ranks, in [0, tag_limit()).
        process_set: an added ProcessSet that both ranks must belong to (None: the job).
        gradient: the adapters' channel for gradients going back in backward passes; its
            messages never match ordinary ones.
    """
    link, dst, tag = _arguments(dst, tag, process_set, "dst", "send")
    data = np.asarray(array)
    check_supported(data.dtype, f"send to rank {dst} with {tag_text(tag, gradient)}")
    operation = Send(link, dst, tag, gradient, data if data.flags.c_contiguous else np.ascontiguousarray(data))
    link.start(operation)
    return P2PHandle(operation)


def recv_async(array_or_shape: Union[np.ndarray, int, Sequence[int]], src: int, tag: int = 0, dtype=None,
               process_set=None, *, gradient: bool = False) -> P2PHandle:
    """Start receiving from job rank `src`; the handle's wait() returns the array.

    Args:
        array_or_shape: a C-contiguous, writeable numpy array to receive into, or the shape
            of a new array of `dtype`. The message must have this shape and dtype exactly.
        src: the sending job rank (not this one).
        tag: as in send_async.
        dtype: the new array's dtype (a numpy dtype or its name; default float32); with an
            array, None or the array's own.
        process_set: as in send_async.
        gradient: as in send_async.
    """
    link, src, tag = _arguments(src, tag, process_set, "src", "recv")
    array = _receiving_array(array_or_shape, dtype, f"recv from rank {src} with {tag_text(tag, gradient)}")
    operation = Recv(link, src, tag, gradient, array)
    link.start(operation)
    return P2PHandle(operation)


def send(array, dst: int, tag: int = 0, process_set=None) -> None:
    """Send `array` to job rank `dst`; returns once the receiver has it (see send_async).
    Two ranks that both `send` to each other first deadlock, as with MPI_Ssend."""
    send_async(array, dst, tag, process_set).wait()


def recv(array_or_shape, src: int, tag: int = 0, dtype=None, process_set=None) -> np.ndarray:
    """Receive a message from job rank `src` into the given array (returned) or a new one
    of the given shape and `dtype` (default float32); see recv_async."""
    return recv_async(array_or_shape, src, tag, dtype, process_set).wait()
