"""Memory for results, recycled once the caller has dropped every view of it.

A collective that returns a new array needs fresh memory, and fresh memory costs a page
fault per page on first touch, a sizeable share of what a shared-memory all-reduce of a
large buffer costs (and MPI must register new buffers too). Mid-sized results suffer too:
glibc hands out blocks from 128 KiB up as fresh mappings, so each new result of that size
faults its pages in again, where a reused buffer's pages are already mapped. The pool keeps
the buffers it handed out and gives one back only when nothing else refers to it any more.

Results start on a 64-byte boundary: TensorFlow takes a numpy result of `tf.numpy_function`
without a copy only when it is aligned for its vector code (64 bytes) and copies it
otherwise, and large blocks from malloc start 16 bytes past a page.
"""

import math
import sys
import threading
from typing import Dict, List

import numpy as np

from .memory import address_of

__all__ = ["OutputPool", "aligned_layout"]

# References to a buffer nobody else holds: the pool's list, the loop variable looking at
# it, and getrefcount's own argument.
_REFS_WHEN_UNUSED = 3
ALIGNMENT = 64


def aligned_layout(counts, itemsize: int):
    """(where each member starts, elements up to the last one's end) in one buffer holding
    members of `counts` elements, each starting on an ALIGNMENT-byte boundary."""
    step = max(ALIGNMENT // itemsize, 1)
    starts, next_start = [], 0
    for count in counts:
        starts.append(next_start)
        next_start += -(-count // step) * step
    return starts, starts[-1] + counts[-1]


class OutputPool:
    """Hands out arrays of at least `min_bytes` backed by reusable buffers.

    Args:
        min_bytes: smaller results come from plain np.empty (the allocator reuses those).
        max_buffers: buffers retained at most; beyond it, results are not recycled.
        max_bytes: bytes retained at most, likewise.
    """

    def __init__(self, min_bytes: int = 64 * 1024, max_buffers: int = 256, max_bytes: int = 1 << 30):
        self.min_bytes = min_bytes
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self._by_size: Dict[int, List[np.ndarray]] = {}
        self._count = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape, dtype: np.dtype) -> np.ndarray:
        """An uninitialized array of `shape` and `dtype` (a numpy dtype object)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        with self._lock:
            buffer = self._reusable(nbytes)
            if buffer is None:
                buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
                self._retain(nbytes, buffer)
        # Views of this slice refer to `buffer` itself (numpy keeps the owner as their base),
        # so the reference count of `buffer` still tells whether any result is alive.
        start = -address_of(buffer) % ALIGNMENT
        return buffer[start:start + nbytes].view(dtype).reshape(shape)

    def _reusable(self, nbytes: int):
        for buffer in self._by_size.get(nbytes, ()):
            if sys.getrefcount(buffer) == _REFS_WHEN_UNUSED:
                return buffer
        return None

    def _retain(self, nbytes: int, buffer: np.ndarray) -> None:
        while self._count >= self.max_buffers or self._bytes + buffer.nbytes > self.max_bytes:
            if not self._drop_one_unused():
                return
        self._by_size.setdefault(nbytes, []).append(buffer)
        self._count += 1
        self._bytes += buffer.nbytes

    def _drop_one_unused(self) -> bool:
        for buffers in self._by_size.values():
            for buffer in buffers:
                if sys.getrefcount(buffer) == _REFS_WHEN_UNUSED:
                    buffers.remove(buffer)
                    self._count -= 1
                    self._bytes -= buffer.nbytes
                    return True
        return False

    def __len__(self) -> int:
        """Buffers retained."""
        return self._count

    def clear(self) -> None:
        with self._lock:
            self._by_size.clear()
            self._count = 0
            self._bytes = 0
