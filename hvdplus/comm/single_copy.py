"""All-reduce inside one node by reading the peers' tensors where they lie (Linux only).

`process_vm_readv` copies straight from another process's memory into ours: the same
single-copy trick MPI libraries use between processes of one node (Open MPI's "CMA"). The
shared window then carries only addresses and barriers, never data. Per rank, for a
buffer of S bytes split into one slice per rank, with n = 2:

- reduce-scatter: read each peer's copy of this rank's slice (S/2) and reduce it into our
  own tensors, which is where the result belongs anyway;
- all-gather: read each peer's reduced slice straight into our tensors (S/2).

That is about half the memory traffic of staging everything through shared memory (copy
in, reduce, copy out), which matters on a node whose cores are busy training.

The kernel allows it between processes of one user when ptrace would be allowed (Yama's
ptrace_scope 1 asks each process to name its peers; containers may forbid the call). Every
rank of the node probes once at start, and all use it only if it works for all of them.
"""

import ctypes
import ctypes.util
import itertools
import os
import sys
from typing import List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .memory import address_of
from .pieces import pieces_of
from .reduction import UFUNCS, apply_scale

__all__ = ["SingleCopy", "open_single_copy"]

# Elements of a reduce-scatter step: the peer's data lands in a scratch buffer that should
# stay in cache until it is reduced.
_SCRATCH_BYTES = 512 * 1024
# Linux caps one call's vectors at IOV_MAX.
_IOV_MAX = 1024
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        read = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    read.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                     ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    read.restype = ctypes.c_ssize_t
    # Under Yama ptrace_scope 1 only a process's ancestors may read it unless it says
    # otherwise; the ranks of a job are siblings. Harmless where Yama is absent.
    libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)
    return libc


class SingleCopy:
    """Reads from the other ranks of a node; barriers and address tables go through `window`."""

    def __init__(self, window, libc, pids: Sequence[int]):
        self.window = window
        self.rank = window.rank
        self.size = window.size
        self._read = libc.process_vm_readv
        self._pids = list(pids)
        self._scratch = {}

    def read(self, peer: int, local: List[tuple], remote: List[tuple]) -> None:
        """Copy each (address, nbytes) range of `remote` on rank `peer` into the range of
        `local` at the same position (same lengths)."""
        for start in range(0, len(remote), _IOV_MAX):
            local_part, remote_part = local[start:start + _IOV_MAX], remote[start:start + _IOV_MAX]
            wanted = sum(length for _, length in remote_part)
            done = self._read(self._pids[peer], (_IoVec * len(local_part))(*local_part), len(local_part),
                              (_IoVec * len(remote_part))(*remote_part), len(remote_part), 0)
            if done != wanted:
                error = ctypes.get_errno()
                raise OSError(error, f"process_vm_readv from local rank {peer} read {done} of {wanted} "
                                     f"bytes: {os.strerror(error)}")

    def _publish(self, arrays: List[np.ndarray], outputs: List[np.ndarray]) -> List[np.ndarray]:
        """Every rank's table of (input, output) addresses, through the window's segments."""
        count = len(arrays)
        tables = self.window.segments(np.dtype(np.uint64))
        mine = tables[self.rank]
        mine[:count] = [address_of(a) for a in arrays]
        mine[count:2 * count] = [address_of(o) for o in outputs]
        self.window.barrier()
        return [table[:2 * count].copy() for table in tables]

    def fits(self, count: int) -> bool:
        return 2 * count <= self.window.segments(np.dtype(np.uint64))[0].size

    def allreduce_arrays(self, arrays: List[np.ndarray], op, scale: float = 1.0,
                         outputs: Optional[List[np.ndarray]] = None) -> None:
        """Reduce flat arrays of one dtype across the node as if they were one buffer, into
        `outputs` (default: in place). Like SharedWindow.allreduce_arrays, used in its place
        where every rank of the node can read the others."""
        outputs = arrays if outputs is None else outputs
        ends = list(itertools.accumulate(a.size for a in arrays))
        total = ends[-1] if ends else 0
        if total == 0:
            return
        itemsize = arrays[0].itemsize
        n, me = self.size, self.rank
        tables = self._publish(arrays, outputs)
        count = len(arrays)
        bounds = [total * p // n for p in range(n + 1)]
        ufunc = UFUNCS[op]
        scratch = self._scratch_for(arrays[0].dtype)
        scratch_address = address_of(scratch)
        step = scratch.size
        for lo in range(bounds[me], bounds[me + 1], step):
            hi = min(lo + step, bounds[me + 1])
            pieces = list(pieces_of(arrays, ends, lo, hi))
            into_scratch = [(scratch_address + (at - lo) * itemsize, (end - begin) * itemsize)
                            for _, begin, end, at in pieces]
            first = True
            for peer in range(n):
                if peer == me:
                    continue
                remote = [(int(tables[peer][i]) + begin * itemsize, (end - begin) * itemsize)
                          for i, begin, end, _ in pieces]
                self.read(peer, into_scratch, remote)
                for i, begin, end, at in pieces:
                    source = arrays[i] if first else outputs[i]
                    ufunc(source[begin:end], scratch[at - lo:at - lo + end - begin], out=outputs[i][begin:end])
                first = False
            if scale != 1.0:
                for i, begin, end, _ in pieces:
                    apply_scale(outputs[i][begin:end], scale)
        self.window.barrier()
        for peer in range(n):
            if peer == me:
                continue
            pieces = list(pieces_of(arrays, ends, bounds[peer], bounds[peer + 1]))
            local = [(int(tables[me][count + i]) + begin * itemsize, (end - begin) * itemsize)
                     for i, begin, end, _ in pieces]
            remote = [(int(tables[peer][count + i]) + begin * itemsize, (end - begin) * itemsize)
                      for i, begin, end, _ in pieces]
            if local:
                self.read(peer, local, remote)
        # No rank may return (and let its tensors change) while another still reads them.
        self.window.barrier()

    def _scratch_for(self, dtype: np.dtype) -> np.ndarray:
        scratch = self._scratch.get(dtype)
        if scratch is None:
            scratch = self._scratch[dtype] = np.empty(_SCRATCH_BYTES // dtype.itemsize, dtype=dtype)
        return scratch


def open_single_copy(window, local_comm) -> Optional[SingleCopy]:
    """A SingleCopy for the node, or None unless every local rank can read every other
    (collective on `local_comm`)."""
    libc = _libc()
    probe = np.full(8, local_comm.Get_rank() + 1, dtype=np.int64)
    pids = local_comm.allgather((os.getpid(), address_of(probe)))
    works = libc is not None
    reader = SingleCopy(window, libc, [pid for pid, _ in pids]) if works else None
    if works:
        local_comm.Barrier()  # every rank has allowed reads (prctl) before anyone reads
        try:
            for peer, (_, address) in enumerate(pids):
                if peer != local_comm.Get_rank():
                    seen = np.zeros(8, dtype=np.int64)
                    reader.read(peer, [(address_of(seen), seen.nbytes)], [(address, seen.nbytes)])
                    works = works and bool((seen == peer + 1).all())
        except OSError:
            works = False
    # Nobody returns (freeing its probe) before everyone has read it; all decide alike.
    works = local_comm.allreduce(int(works), op=MPI.MIN) == 1
    return reader if works else None
