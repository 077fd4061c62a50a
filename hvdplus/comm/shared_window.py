"""All-reduce inside one node through an MPI-3 shared-memory window.

Every rank of the node owns one segment of a window from `MPI.Win.Allocate_shared` and
can read all the others' segments as plain numpy arrays. The buffer is processed in
chunks small enough to stay in cache; per chunk, with `n` ranks and slice `s_p` of the
chunk assigned to rank p:

1. each rank copies its data for the other ranks' slices into its segment;
2. each rank reduces its own slice, its private data with every other segment's copy of
   that slice, into its own segment;
3. each rank copies every reduced slice back into its buffer.

A node barrier separates the steps. Segments are double-buffered, so the copies of one
chunk may overlap the reading of the previous one, and a rank never copies its own slice
into shared memory: about one memory pass less than copying everything in and out.

The barrier is hvdplus' own, on a counter at the head of each segment: a rank waiting for
the others yields its core (and the GIL) between looks, where MPI_Barrier would spin. On a
node where every core trains, the engine thread waiting for a slower rank must not take
the core from this rank's own backward pass. It relies on x86's ordering of stores (data
written before a counter is visible before it); elsewhere MPI_Barrier is used.
"""

import itertools
import platform
from typing import List

import numpy as np
from mpi4py import MPI

from .failures import check_peers
from .memory import same_memory
from .pieces import pieces_of
from .reduction import UFUNCS, apply_scale
from .waiting import wait_until

__all__ = ["SharedWindow"]

# Per rank and buffer half; 2 MiB of float64 keeps a chunk's working set within L2.
CHUNK_BYTES = 4 * 1024 * 1024
# Each segment starts with its rank's barrier counter, alone on a cache line.
HEADER_BYTES = 64
_STORES_ARE_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


class SharedWindow:
    """A node's shared segments, allocated once per communicator (collective on it)."""

    def __init__(self, local_comm, chunk_bytes: int = CHUNK_BYTES):
        self.comm = local_comm
        self.rank = local_comm.Get_rank()
        self.size = local_comm.Get_size()
        self.chunk_bytes = chunk_bytes
        self.window = MPI.Win.Allocate_shared(HEADER_BYTES + 2 * chunk_bytes, 1, comm=local_comm)
        self._segments = [memoryview(self.window.Shared_query(peer)[0]) for peer in range(self.size)]
        self._views = {}
        self._counters = [np.frombuffer(seg, dtype=np.int64, count=1) for seg in self._segments]
        self._counters[self.rank][0] = 0
        self._arrivals = 0
        local_comm.Barrier()  # every counter is zero before anyone counts

    def barrier(self) -> None:
        """Return once every rank of the node has called barrier() as often as this one."""
        if not _STORES_ARE_ORDERED:
            self.comm.Barrier()
            return
        self._arrivals += 1
        arrivals = self._arrivals
        self._counters[self.rank][0] = arrivals
        for counter in self._counters:
            wait_until(lambda: counter[0] >= arrivals, lambda: check_peers(self.comm))

    def free(self) -> None:
        self._views.clear()
        self._counters = []
        self._segments = []
        self.window.Free()

    def segments(self, dtype: np.dtype) -> List[np.ndarray]:
        """Every rank's segment as a flat array of `dtype` (both halves)."""
        views = self._views.get(dtype)
        if views is None:
            count = 2 * self.chunk_bytes // dtype.itemsize
            views = self._views[dtype] = [
                np.frombuffer(seg, dtype=dtype, count=count, offset=HEADER_BYTES) for seg in self._segments
            ]
        return views

    def _chunks(self, total: int, itemsize: int):
        """(segment offset, start, stop) of each chunk of a `total`-element buffer; chunks
        alternate between the two halves of the segments."""
        chunk = self.chunk_bytes // itemsize
        for index, start in enumerate(range(0, total, chunk)):
            yield (index % 2) * chunk, start, min(start + chunk, total)

    def _share_then_reduce(self, segments, data, base, bounds, op, into) -> None:
        """Steps 1 and 2 for one chunk: publish this rank's data for the others' ranges
        (`bounds[p]:bounds[p + 1]` of `data` is rank p's), then reduce this rank's range into `into`."""
        me = self.rank
        mine = segments[me]
        others = [p for p in range(self.size) if p != me]
        for peer in others:
            lo, hi = bounds[peer], bounds[peer + 1]
            mine[base + lo:base + hi] = data[lo:hi]
        self.barrier()
        lo, hi = bounds[me], bounds[me + 1]
        ufunc = UFUNCS[op]
        ufunc(data[lo:hi], segments[others[0]][base + lo:base + hi], out=into)
        for peer in others[1:]:
            ufunc(into, segments[peer][base + lo:base + hi], out=into)

    def allreduce(self, source: np.ndarray, op, output: np.ndarray = None) -> np.ndarray:
        """Reduce the node's `source` buffers elementwise into `output` (default: in place).

        Both are flat and C-contiguous in the accumulation dtype; `output` may be `source`.
        Returns `output`."""
        output = source if output is None else output
        if self.size == 1 or source.size == 0:
            if output is not source:
                output[...] = source
            return output
        segments = self.segments(source.dtype)
        n = self.size
        for base, start, stop in self._chunks(source.size, source.itemsize):
            length = stop - start
            bounds = [length * p // n for p in range(n + 1)]
            lo, hi = bounds[self.rank], bounds[self.rank + 1]
            reduced = segments[self.rank][base + lo:base + hi]
            self._share_then_reduce(segments, source[start:stop], base, bounds, op, reduced)
            self.barrier()
            result = output[start:stop]
            for peer in range(n):
                lo, hi = bounds[peer], bounds[peer + 1]
                result[lo:hi] = segments[peer][base + lo:base + hi]
        # The next call's first chunk reuses this call's buffer half only after this barrier.
        self.barrier()
        return output

    def allreduce_arrays(self, arrays: List[np.ndarray], op, scale: float = 1.0, outputs=None) -> None:
        """Reduce each of several flat arrays of one dtype into `outputs` (default: in
        place), as if they were one buffer, without packing them into one: the shared
        segments are the only staging area, so a fused batch of gradients costs no copy in
        or out of a fusion buffer.

        `scale` multiplies the result (Average's 1/size, a postscale factor): each rank
        scales only its own slice before publishing it, rather than everyone everything."""
        if outputs is not None:
            for array, output in zip(arrays, outputs):
                if not same_memory(output, array):
                    np.copyto(output, array)
            arrays = outputs
        if self.size == 1 or not arrays:
            for array in arrays:
                if scale != 1.0:
                    apply_scale(array, scale)
            return
        ends = list(itertools.accumulate(a.size for a in arrays))
        total = ends[-1]
        if total == 0:
            return
        ufunc = UFUNCS[op]
        segments = self.segments(arrays[0].dtype)
        n, me = self.size, self.rank
        mine = segments[me]
        others = [p for p in range(n) if p != me]
        for base, start, stop in self._chunks(total, arrays[0].itemsize):
            length = stop - start
            bounds = [start + length * p // n for p in range(n + 1)]
            for peer in others:
                for index, lo, hi, at in pieces_of(arrays, ends, bounds[peer], bounds[peer + 1]):
                    mine[base + at - start:base + at - start + hi - lo] = arrays[index][lo:hi]
            self.barrier()
            for index, lo, hi, at in pieces_of(arrays, ends, bounds[me], bounds[me + 1]):
                where = slice(base + at - start, base + at - start + hi - lo)
                reduced = mine[where]
                ufunc(arrays[index][lo:hi], segments[others[0]][where], out=reduced)
                for peer in others[1:]:
                    ufunc(reduced, segments[peer][where], out=reduced)
                if scale != 1.0:
                    apply_scale(reduced, scale)
            self.barrier()
            for peer in range(n):
                for index, lo, hi, at in pieces_of(arrays, ends, bounds[peer], bounds[peer + 1]):
                    arrays[index][lo:hi] = segments[peer][base + at - start:base + at - start + hi - lo]
        self.barrier()

    def reducescatter(self, source: np.ndarray, op, offsets, output: np.ndarray) -> np.ndarray:
        """Reduce the node's flat `source` buffers; rank p keeps elements
        `offsets[p]:offsets[p + 1]`, written into this rank's `output`."""
        n, me = self.size, self.rank
        segments = self.segments(source.dtype)
        for base, start, stop in self._chunks(source.size, source.itemsize):
            bounds = [min(max(offset - start, 0), stop - start) for offset in offsets]
            into = output[start + bounds[me] - offsets[me]:start + bounds[me + 1] - offsets[me]]
            if n == 1:
                into[...] = source[start:stop]
                continue
            # No second barrier: a segment half is rewritten two chunks later, after the next
            # chunk's barrier, which every rank reaches only once done reading this one.
            self._share_then_reduce(segments, source[start:stop], base, bounds, op, into)
        self.barrier()
        return output

    def allgather(self, block: np.ndarray, offsets, output: np.ndarray) -> np.ndarray:
        """Every rank's flat `block` into `output`, rank p's at `offsets[p]:offsets[p + 1]`
        (uint8 views carry any dtype)."""
        segments = self.segments(block.dtype)
        chunk = self.chunk_bytes // block.itemsize
        longest = max(offsets[p + 1] - offsets[p] for p in range(self.size))
        for index, start in enumerate(range(0, longest, chunk)):
            base = (index % 2) * chunk
            piece = block[start:start + chunk]
            segments[self.rank][base:base + piece.size] = piece
            self.barrier()
            for peer in range(self.size):
                begin = offsets[peer] + start
                end = min(begin + chunk, offsets[peer + 1])
                if end > begin:
                    output[begin:end] = segments[peer][base:base + end - begin]
        self.barrier()
        return output

