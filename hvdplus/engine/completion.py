"""Where submitted operations end: each handle completed with its result or error, and the
callers that sleep on handles woken. Once the engine fails (a shutdown, a stall, a lost peer)
every pending operation and every later submission ends with that failure."""

import threading
from typing import Optional

from ..common.errors import RanksFailedError

__all__ = ["Completions", "for_name"]


class Completions:
    """Completes the handles of `queue`'s entries; `lock` guards the queue."""

    def __init__(self, queue, lock):
        self._queue = queue
        self._lock = lock
        self._completed = threading.Condition()
        self.failure: Optional[BaseException] = None  # read under `lock` by submit

    def complete(self, name, result=None, error=None) -> None:
        with self._lock:
            entry = self._queue.pop(name)
        if entry is None:
            return
        if error is not None:
            entry.handle.set_error(error)
        else:
            entry.handle.set_result(result)

    def notify(self) -> None:
        """Wake the callers sleeping in wait_until_done."""
        with self._completed:
            self._completed.notify_all()

    def wait_until_done(self, handle) -> None:
        with self._completed:
            while not handle.done():
                self._completed.wait(timeout=1.0)

    def fail_everything(self, error: BaseException) -> None:
        """End every pending operation with `error`, and every later submission (the first
        failure stays)."""
        with self._lock:
            if self.failure is None:
                self.failure = error
            entries = self._queue.take_all()
        for entry in entries:
            entry.handle.set_error(for_name(error, entry.name))
        self.notify()


def for_name(error: BaseException, name: str) -> BaseException:
    """`error` again, with the name of the operation it ended in front of its message."""
    if isinstance(error, RanksFailedError):
        return RanksFailedError(f"'{name}': {error}", error.ranks)
    return type(error)(f"'{name}': {error}")
