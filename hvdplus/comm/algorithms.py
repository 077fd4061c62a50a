"""Which algorithm runs a collective on a given buffer, and running it.

`HVDPLUS_ALLREDUCE_ALGO` (launcher `--allreduce-algo`, or `--hierarchical-allreduce`) picks
one of:

- `mpi`: the MPI library's `MPI_Allreduce`;
- `ring`: hvdplus' ring (reduce-scatter then all-gather over point-to-point messages);
- `shm`: hvdplus' shared-memory all-reduce; all ranks must share one node;
- `hierarchical`: inside each node, then across nodes, then inside each node again;
- `auto` (default): by size and topology, at crossover points that benchmarks/collectives.py
  measures (see docs/performance.md): `MPI_Allreduce` below `SMALL_BYTES`, where its
  latency wins; above it, `shm` when all ranks share a node, else `hierarchical`. The
  engine's all-reduces on one node always use `shm` (see `engine_algorithm`).

On one node, reducescatter goes through the shared window from `SMALL_BYTES` up (where it
beats MPI's) and allgather from `SHM_ALLGATHER_BYTES` of output up (below that MPI's
single-copy transport is faster); otherwise both use MPI.
"""

import math

import numpy as np
from mpi4py import MPI

from ..common.dtypes import accumulation_dtype
from ..common.reduce_ops import ReduceOp
from . import mpi_collectives
from .hierarchical import hierarchical_allreduce
from .memory import same_memory
from .output_pool import OutputPool
from .reduction import apply_scale
from .ring import ring_allreduce
from .shared_window import SharedWindow
from .single_copy import open_single_copy
from .waiting import arrive_together

__all__ = ["CollectiveAlgorithms", "SMALL_BYTES"]

_AVERAGE = ReduceOp.AVERAGE  # a module constant: enum attribute lookups are slow

# Below this many bytes MPI_Allreduce's latency beats every algorithm of ours.
SMALL_BYTES = 64 * 1024
# Allgather only moves data, which MPI's single-copy transport does well until about here.
SHM_ALLGATHER_BYTES = 32 * 1024 * 1024
# Without single-copy reads (a container forbidding them), a fused batch's arrays between
# these sizes are each all-reduced by MPI_Allreduce in place: in that range one MPI call per
# array beats staging them through the window, whose copies in and out cost more than they
# save; above it the window wins again. With single-copy reads, the whole batch goes through
# them instead: they move about half the memory that staging does (see single_copy) and apply
# Average's scale to each slice while it is in cache rather than in a pass of its own, so they
# beat an MPI call per array. Either way, small arrays are packed into one MPI call while they
# come to less than SMALL_BYTES together, where MPI's latency beats the window's barriers;
# otherwise they fuse through the window, which is cheaper than one MPI call each.
MPI_PER_ARRAY_BYTES = (SMALL_BYTES, 16 * 1024 * 1024)
# From here up, reading the peers' buffers directly (single_copy) beats staging through the
# shared window.
SINGLE_COPY_BYTES = 1024 * 1024
# From here up, the ranks meet before an all-reduce outside the shared window (a barrier
# that does not spin, see waiting): its latency is small beside the transfer.
ARRIVE_TOGETHER_BYTES = 1024 * 1024


def _mpi_allreduce(comm, flat, op):
    if comm.Get_size() > 1 and flat.size:
        comm.Allreduce(MPI.IN_PLACE, flat, op=mpi_collectives.MPI_OPS[op])


def _packed_mpi_allreduce(comm, pairs, op, scale: float) -> None:
    """Small flat (source, target) arrays of one dtype all-reduced by one MPI call over a
    packed copy: for arrays this small, MPI's latency is far below the cost of the shared
    window's three barriers and per-piece bookkeeping."""
    packed = np.concatenate([source for source, _ in pairs])
    _mpi_allreduce(comm, packed, op)
    if scale != 1.0:
        apply_scale(packed, scale)
    offset = 0
    for _, target in pairs:
        target[...] = packed[offset:offset + target.size]
        offset += target.size


class CollectiveAlgorithms:
    """Built once per `init()`: owns the node's shared window when one is useful."""

    def __init__(self, topology, algorithm: str = "auto", single_copy: bool = True):
        self.topology = topology
        self.comm = topology.comm
        self.size = topology.size
        self.single_node = topology.local_comm.Get_size() == self.size
        if algorithm == "shm" and not self.single_node:
            raise ValueError(
                "HVDPLUS_ALLREDUCE_ALGO=shm needs every rank on one node; "
                "use hierarchical (shared memory inside each node) instead"
            )
        self.algorithm = algorithm
        local_size = topology.local_comm.Get_size()
        self.window = SharedWindow(topology.local_comm) if local_size > 1 else None
        # All-reduces on the node read the peers' buffers directly where the kernel allows it.
        self.single_copy = open_single_copy(self.window, topology.local_comm) if single_copy and self.window else None
        self.outputs = OutputPool()
        # The engine's thread runs beside the training loop on the same cores: there, waiting
        # for a slower rank must yield the core, which the shared window's barrier does and
        # MPI_Allreduce does not.
        self.engine_algorithm = "shm" if algorithm == "auto" and self.single_node and self.window else None

    def free(self) -> None:
        self.outputs.clear()
        if self.window is not None:
            self.window.free()
            self.window = None

    def choose(self, nbytes: int) -> str:
        """The algorithm for a buffer of `nbytes` (the configured one unless it is auto)."""
        if self.algorithm != "auto":
            return self.algorithm
        if nbytes < SMALL_BYTES or self.size == 1:
            return "mpi"
        return "shm" if self.single_node else "hierarchical"

    def reduce(self, source: np.ndarray, op: ReduceOp, output: np.ndarray = None, algorithm=None) -> np.ndarray:
        """Elementwise `op` of every rank's flat `source` into `output` (default: in place).

        Buffers are C-contiguous, 1-d and in their accumulation dtype; Average reduces as a
        sum (the caller divides). Returns `output`."""
        output = source if output is None else output
        if self.size == 1:
            if output is not source:
                output[...] = source
            return output
        algorithm = algorithm or self.choose(source.nbytes)
        if algorithm == "shm":
            if self._reads_peers(source.nbytes, 1):
                self.single_copy.allreduce_arrays([source], op, outputs=[output])
                return output
            return self.window.allreduce(source, op, output)
        if algorithm == "mpi" and output is not source:
            self._arrive_together(source.nbytes)
            self.comm.Allreduce(source, output, op=mpi_collectives.MPI_OPS[op])
            return output
        if output is not source:
            output[...] = source
        self._arrive_together(source.nbytes)
        if algorithm == "mpi":
            _mpi_allreduce(self.comm, output, op)
        elif algorithm == "ring":
            ring_allreduce(self.comm, output, op)
        elif algorithm == "hierarchical":
            # The ring across nodes, two of them included: MPI_Allreduce of two ranks (Open
            # MPI's reduce, then broadcast) sends one way, then the other, where the ring
            # sends both ways at once.
            hierarchical_allreduce(self.topology, output, op, ring_allreduce)
        else:
            raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")
        return output

    def _arrive_together(self, nbytes: int) -> None:
        """Before moving a large buffer, wait for every rank without spinning: ranks that
        arrive first would spin in MPI and, where ranks outnumber cores, keep the last from
        preparing their data (see waiting)."""
        if nbytes >= ARRIVE_TOGETHER_BYTES:
            arrive_together(self.comm)

    def allreduce(self, array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                  algorithm=None, output=None):
        """All-reduce a numpy array with Horovod's scaling semantics:
        `postscale * reduce(prescale * array)`, Average dividing by size().

        Args:
            output: a C-contiguous array of `array`'s shape and dtype that receives the
                result (it may be `array` itself: an in-place all-reduce); None for a new array.

        The communication layer called directly: no engine, no cross-rank checks. Written
        tightly because on small buffers every microsecond of Python shows beside MPI's latency."""
        accumulate = accumulation_dtype(array.dtype)
        flat = array.reshape(-1)
        if accumulate == array.dtype and prescale_factor == 1.0 and flat.flags.c_contiguous:
            target = self.outputs.empty(flat.shape, accumulate) if output is None else output.reshape(-1)
            if same_memory(target, flat):
                result = self.reduce(flat, op, algorithm=algorithm)
            else:
                result = self.reduce(flat, op, target, algorithm)
        else:
            # Converted or prescaled, so a private copy that may be reduced in place.
            result = mpi_collectives.prepare_reduction(flat, prescale_factor)
            self.reduce(result, op, algorithm=algorithm)
        if op == _AVERAGE or postscale_factor != 1.0:
            mpi_collectives.finish_reduction(result, op, postscale_factor, self.size)
        if output is None:
            if result.dtype == array.dtype:
                return result.reshape(array.shape)
            output = self.outputs.empty(array.shape, array.dtype)  # converted back into pooled memory
        if not same_memory(result, output):
            np.copyto(output, result.reshape(array.shape), casting="unsafe")
        return output

    def allreduce_in_place(self, flat, op, prescale_factor=1.0, postscale_factor=1.0, algorithm=None) -> None:
        """All-reduce the flat accumulation-dtype buffer `flat` in place, scaling included."""
        if prescale_factor != 1.0:
            apply_scale(flat, prescale_factor)
        self.reduce(flat, op, algorithm=algorithm)
        mpi_collectives.finish_reduction(flat, op, postscale_factor, self.size)

    def allreduce_arrays(self, sources, op, scale: float, targets) -> None:
        """All-reduce a fused batch on one node: each flat accumulation-dtype array of
        `sources` into the same-shaped array of `targets` (which may be the source itself),
        times `scale`, with no fusion buffer: mid-sized arrays one MPI_Allreduce each, small
        ones packed into one MPI call while under SMALL_BYTES together, the rest together
        through the shared window (all of them where it reads the peers' arrays directly).
        The split depends only on agreed sizes and the node's single-copy probe."""
        low, high = MPI_PER_ARRAY_BYTES if self.single_copy is None else (math.inf, math.inf)
        small, fused_sources, fused_targets = [], [], []
        for source, target in zip(sources, targets):
            if low <= source.nbytes <= high:
                self.reduce(source, op, None if same_memory(source, target) else target, algorithm="mpi")
                if scale != 1.0:
                    apply_scale(target, scale)
            elif source.nbytes < low:
                small.append((source, target))
            else:
                fused_sources.append(source)
                fused_targets.append(target)
        if small and sum(source.nbytes for source, _ in small) < SMALL_BYTES:
            _packed_mpi_allreduce(self.comm, small, op, scale)
        else:
            fused_sources += [source for source, _ in small]
            fused_targets += [target for _, target in small]
        if not fused_sources:
            return
        if self._reads_peers(sum(source.nbytes for source in fused_sources), len(fused_sources)):
            self.single_copy.allreduce_arrays(fused_sources, op, scale, fused_targets)
        else:
            self.window.allreduce_arrays(fused_sources, op, scale, outputs=fused_targets)

    def _reads_peers(self, nbytes: int, count: int) -> bool:
        """Whether `count` arrays of `nbytes` in all go through the single-copy reads rather
        than the shared window (decided alike on every rank, from agreed sizes)."""
        return self.single_copy is not None and nbytes >= SINGLE_COPY_BYTES and self.single_copy.fits(count)

    def _shared_window_for(self, nbytes: int, threshold: int = SMALL_BYTES):
        """The window, when a collective over `nbytes` should use it."""
        if self.window is not None and self.single_node and nbytes >= threshold:
            return self.window
        return None

    def reducescatter(self, array, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0):
        """Reduce `array` over all ranks; this rank keeps its block of rows (the first
        `dim0 % size` ranks get one row more)."""
        window = self._shared_window_for(array.nbytes)
        if window is None:
            return mpi_collectives.reducescatter(self.comm, array, op, prescale_factor, postscale_factor)
        rows = mpi_collectives.reducescatter_rows(array.shape[0], self.size)
        row_elements = math.prod(array.shape[1:])
        offsets = [0]
        for count in rows:
            offsets.append(offsets[-1] + count * row_elements)
        source = mpi_collectives.prepare_reduction(array, prescale_factor).reshape(-1)
        output = np.empty((rows[self.topology.rank],) + array.shape[1:], dtype=source.dtype)
        window.reducescatter(source, op, offsets, output.reshape(-1))
        if op == _AVERAGE or postscale_factor != 1.0:
            mpi_collectives.finish_reduction(output, op, postscale_factor, self.size)
        return output.astype(array.dtype, copy=False)

    def allgather(self, array, first_dims):
        """Every rank's `array` concatenated along axis 0; rank r gives `first_dims[r]` rows."""
        output_shape = (sum(first_dims),) + array.shape[1:]
        window = self._shared_window_for(math.prod(output_shape) * array.itemsize, SHM_ALLGATHER_BYTES)
        if window is None:
            return mpi_collectives.allgather(self.comm, array, first_dims)
        row_bytes = math.prod(array.shape[1:]) * array.itemsize
        offsets = [0]
        for rows in first_dims:
            offsets.append(offsets[-1] + rows * row_bytes)
        output = self.outputs.empty(output_shape, array.dtype)
        block = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        window.allgather(block, offsets, output.reshape(-1).view(np.uint8))
        return output
