"""The all-reduce algorithms (ring, hierarchical) against numpy, on any number of ranks.

Runs on 1, 2 and 3 ranks, and with HVDPLUS_RANKS_PER_NODE=2 on 3, 4 and 6 ranks so the
hierarchical algorithm meets homogeneous (2x2, 3x2) and uneven (2+1) nodes. Buffers are
in their accumulation dtype, as the algorithms expect, and Average is expected as a sum.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import hvdplus as hvd
from hvdplus.comm.hierarchical import hierarchical_allreduce
from hvdplus.common.reduce_ops import ELEMENTWISE_OPS
from hvdplus.comm.mpi_collectives import MPI_OPS
from hvdplus.comm.reduction import UFUNCS
from hvdplus.comm.ring import ring_allgather, ring_allreduce, ring_reducescatter
from hvdplus.comm.shared_window import SharedWindow
from hvdplus.core.runtime import current

from testkit import late_peer
from testkit.rank_data import rank_values

DTYPES = ["float32", "float64", "int8", "int32", "int64", "uint8"]
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
COUNTS = {
    "empty": lambda size: 0,
    "one": lambda size: 1,
    "fewer-than-ranks": lambda size: size - 1,
    "prime": lambda size: 1009,
}
LARGE_COUNT = (64 << 20) // 4 + 3  # float32 elements: just over 64 MiB, not divisible by any ring.


def mpi_allreduce(comm, flat, op):
    """The MPI library's all-reduce, as a cross-node algorithm for the hierarchical one."""
    if flat.size:
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI_OPS[op])


def run_ring(flat, op):
    ring_allreduce(current().topology.comm, flat, op)


def run_ring_in_tiny_pieces(flat, op):
    # Pieces of 24 bytes: many per segment, so the receive window wraps around many times.
    ring_allreduce(current().topology.comm, flat, op, piece_bytes=24)


def run_hierarchical_over_ring(flat, op):
    hierarchical_allreduce(current().topology, flat, op, ring_allreduce)


def run_hierarchical_in_tiny_pieces(flat, op):
    hierarchical_allreduce(current().topology, flat, op, ring_allreduce, piece_bytes=24)


def run_hierarchical_over_mpi(flat, op):
    hierarchical_allreduce(current().topology, flat, op, mpi_allreduce)


# A second window whose chunks hold 40 bytes: many chunks per buffer, so the double
# buffering of segments is exercised. Created while every rank imports this module.
TINY_CHUNK_WINDOW = SharedWindow(current().topology.local_comm, chunk_bytes=40)


def run_shm(flat, op):
    current().algorithms.reduce(flat, op, algorithm="shm")


def run_shm_in_tiny_chunks(flat, op):
    TINY_CHUNK_WINDOW.allreduce(flat, op)


def run_shm_into_another_buffer(flat, op):
    output = np.full_like(flat, 7)
    TINY_CHUNK_WINDOW.allreduce(flat.copy(), op, output)
    flat[...] = output


ALGORITHMS = {
    "ring": run_ring,
    "ring-tiny-pieces": run_ring_in_tiny_pieces,
    "hierarchical-ring": run_hierarchical_over_ring,
    "hierarchical-mpi": run_hierarchical_over_mpi,
    "hierarchical-tiny-pieces": run_hierarchical_in_tiny_pieces,
}
if current().algorithms.single_node:
    # Shared memory reduces within a node only: with simulated nodes it is part of hierarchical.
    ALGORITHMS.update({"shm": run_shm, "shm-tiny-chunks": run_shm_in_tiny_chunks,
                       "shm-out-of-place": run_shm_into_another_buffer})


def expected_reduction(dtype, count, seed, op, size, low, high):
    """What every rank should hold: numpy's reduction of every rank's data, in `dtype`
    (integer sums and products wrap around exactly as the algorithms' do)."""
    result = rank_values(dtype, (count,), 0, seed, low, high)
    for other in range(1, size):
        UFUNCS[op](result, rank_values(dtype, (count,), other, seed, low, high), out=result)
    return result


def assert_reduced(actual, expected):
    if actual.dtype.kind in "iu":
        np.testing.assert_array_equal(actual, expected)
    else:
        tol = TOLERANCE[actual.dtype.name]
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# The whole grid of algorithm, op, dtype and count (about 1,150 cases) runs at 2 and 3 ranks.
# The jobs that run this file again under other settings (posed nodes, a tiny fusion buffer,
# one rank, MPICH) set HVDPLUS_TEST_GRID=pairs: one dtype a case, turning with the other three,
# so that every dtype still meets every algorithm, every op and every count (192 cases).
WHOLE_GRID = os.environ.get("HVDPLUS_TEST_GRID", "whole") == "whole"


def allreduce_cases():
    for a, algorithm in enumerate(ALGORITHMS):
        for o, op in enumerate(ELEMENTWISE_OPS):
            for c, count_name in enumerate(COUNTS):
                dtypes = DTYPES if WHOLE_GRID else [DTYPES[(a + o + c) % len(DTYPES)]]
                for dtype in dtypes:
                    yield pytest.param(algorithm, op, dtype, count_name,
                                       id=f"{algorithm}-{op.label}-{dtype}-{count_name}")


@pytest.mark.parametrize("algorithm, op, dtype, count_name", list(allreduce_cases()))
def test_allreduce_matches_numpy(algorithm, op, dtype, count_name, rank, size):
    count = COUNTS[count_name](size)
    # Products of many values leave float and integer ranges alike: keep factors near one.
    low, high = (0.5, 1.5) if op == hvd.Product and dtype.startswith("float") else (-3, 3)
    flat = rank_values(dtype, (count,), rank, 21, low, high)
    ALGORITHMS[algorithm](flat, op)
    assert_reduced(flat, expected_reduction(dtype, count, 21, op, size, low, high))


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical-ring", "hierarchical-mpi"] + (
    ["shm"] if current().algorithms.single_node else []))
def test_large_float32_sum(algorithm, rank, size):
    # Whole numbers below 2**24 add up exactly in float32, in any order, so the result is
    # checked bit for bit; the pattern's period is prime so a misplaced piece shows.
    pattern = (np.arange(LARGE_COUNT, dtype=np.int32) % 1021).astype(np.float32)
    flat = pattern * np.float32(rank + 1)
    ALGORITHMS[algorithm](flat, hvd.Sum)
    pattern *= np.float32(size * (size + 1) // 2)
    assert np.array_equal(flat, pattern)


@pytest.mark.parametrize("count_name", list(COUNTS))
def test_ring_reducescatter_then_allgather(count_name, rank, size):
    comm = current().topology.comm
    count = COUNTS[count_name](size)
    # Uneven segments, the last rank's the largest, some empty when count < size.
    counts = [count // size] * size
    counts[-1] += count - sum(counts)
    flat = rank_values("int64", (count,), rank, 22)
    expected = expected_reduction("int64", count, 22, hvd.Max, size, -3, 3)
    start = sum(counts[:rank])
    mine = ring_reducescatter(comm, flat, hvd.Max, counts)
    np.testing.assert_array_equal(mine, expected[start:start + counts[rank]])
    ring_allgather(comm, flat, counts)
    np.testing.assert_array_equal(flat, expected)


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "hierarchical", "auto"] + (
    ["shm"] if current().algorithms.single_node else []))
@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
def test_direct_allreduce_with_scaling_and_dtypes(algorithm, dtype, rank, size):
    """The communication layer called without the engine: Horovod's scaling semantics."""
    data = rank_values(dtype, (5, 7), rank, 61)
    stack = np.stack([rank_values(dtype, (5, 7), r, 61).astype(np.float64) for r in range(size)])
    algorithms = current().algorithms
    pick = None if algorithm == "auto" else algorithm
    if dtype == "int32":
        result = algorithms.allreduce(data, hvd.Sum, algorithm=pick)
        np.testing.assert_array_equal(result, stack.sum(0).astype(np.int32))
    else:
        result = algorithms.allreduce(data, hvd.Average, 0.5, 3.0, algorithm=pick)
        tol = 1e-2 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(result.astype(np.float64), 1.5 * stack.mean(0), rtol=tol, atol=tol)
    assert result.dtype == np.dtype(dtype) and result.shape == (5, 7)
    np.testing.assert_array_equal(data, rank_values(dtype, (5, 7), rank, 61))  # input untouched


SINGLE_NODE = current().algorithms.single_node


@pytest.mark.skipif(not SINGLE_NODE, reason="the shared window spans one node")
@pytest.mark.parametrize("window_name", ["default", "tiny-chunks"])
@pytest.mark.parametrize("count_name", list(COUNTS))
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Max, hvd.Product])
def test_shm_reducescatter_with_uneven_ranges(window_name, count_name, op, rank, size):
    window = TINY_CHUNK_WINDOW if window_name == "tiny-chunks" else current().algorithms.window
    if window is None:
        pytest.skip("one rank has no window")
    count = COUNTS[count_name](size)
    # Uneven ranges, the first rank's the largest, some empty when count < size.
    offsets = [0] + [count - (count * (size - p)) // (size + 1) for p in range(1, size)] + [count]
    source = rank_values("int32", (count,), rank, 71)
    expected = expected_reduction("int32", count, 71, op, size, -3, 3)
    output = np.full(offsets[rank + 1] - offsets[rank], -99, dtype=np.int32)
    window.reducescatter(source, op, offsets, output)
    np.testing.assert_array_equal(output, expected[offsets[rank]:offsets[rank + 1]])


@pytest.mark.skipif(not SINGLE_NODE, reason="the shared window spans one node")
@pytest.mark.parametrize("window_name", ["default", "tiny-chunks"])
def test_shm_allgather_with_uneven_blocks(window_name, rank, size):
    window = TINY_CHUNK_WINDOW if window_name == "tiny-chunks" else current().algorithms.window
    if window is None:
        pytest.skip("one rank has no window")
    lengths = [0 if p == 1 else 37 * (p + 1) for p in range(size)]
    offsets = list(np.concatenate(([0], np.cumsum(lengths))))
    blocks = [rank_values("uint8", (lengths[p],), p, 72, 0, 255) for p in range(size)]
    output = np.zeros(offsets[-1], dtype=np.uint8)
    window.allgather(blocks[rank], offsets, output)
    np.testing.assert_array_equal(output, np.concatenate(blocks))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_large_reducescatter_and_allgather_through_the_chosen_path(dtype, rank, size):
    """Big enough for the shared window on one node (MPI elsewhere); must equal numpy."""
    layer = current().algorithms
    rows = 5003  # prime: blocks of rows differ in size across ranks
    data = rank_values(dtype, (rows, 16), rank, 73)
    stack = np.stack([rank_values(dtype, (rows, 16), r, 73).astype(np.float64) for r in range(size)])
    mine = layer.reducescatter(data, hvd.Sum)
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    expected = stack.sum(0)[start:start + base + (rank < extra)]
    tol = 1e-2 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(mine.astype(np.float64), expected, rtol=tol, atol=tol)
    assert mine.dtype == np.dtype(dtype)
    first_dims = [rows - r for r in range(size)]
    pieces = [rank_values(dtype, (first_dims[r], 16), r, 74) for r in range(size)]
    np.testing.assert_array_equal(layer.allgather(pieces[rank], first_dims), np.concatenate(pieces))


@pytest.mark.skipif(not SINGLE_NODE, reason="the shared window spans one node")
@pytest.mark.parametrize("window_name", ["default", "tiny-chunks"])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Product])
def test_shm_allreduce_of_several_arrays_in_place(window_name, op, rank, size):
    """Arrays of assorted sizes (empty ones too) reduced as one buffer, where they lie."""
    window = TINY_CHUNK_WINDOW if window_name == "tiny-chunks" else current().algorithms.window
    if window is None:
        pytest.skip("one rank has no window")
    lengths = [5, 0, 1, 17, 0, 3, 1009, 2]
    arrays = [rank_values("int64", (n,), rank, 80 + i) for i, n in enumerate(lengths)]
    expected = [expected_reduction("int64", n, 80 + i, op, size, -3, 3) for i, n in enumerate(lengths)]
    window.allreduce_arrays(arrays, op)
    for array, want in zip(arrays, expected):
        np.testing.assert_array_equal(array, want)


@pytest.mark.skipif(not SINGLE_NODE, reason="the shared window spans one node")
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min])
def test_fused_batch_of_mixed_sizes_on_one_node(op, rank, size):
    """The engine's in-place batch path: tiny arrays (one packed MPI call), mid-sized ones
    (MPI per array, or single-copy reads where the node allows them) and an empty one, some
    into separate targets, scaled like an Average."""
    algorithms = current().algorithms
    if algorithms.window is None:
        pytest.skip("one rank has no window")
    lengths = [3, 70_000, 0, 1, 300_001, 17]
    sources = [rank_values("float32", (n,), rank, 120 + i, -2, 2) for i, n in enumerate(lengths)]
    expected = [expected_reduction("float32", n, 120 + i, op, size, -2, 2) * 0.5 for i, n in enumerate(lengths)]
    targets = [source if i % 2 else np.full_like(source, np.nan) for i, source in enumerate(sources)]
    algorithms.allreduce_arrays(sources, op, 0.5, targets)
    for target, want in zip(targets, expected):
        np.testing.assert_allclose(target, want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not SINGLE_NODE, reason="the shared window spans one node")
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Max, hvd.Product])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "into-outputs"])
def test_single_copy_reads_peers_arrays_directly(op, in_place, rank, size):
    """Arrays of assorted sizes, some spanning several scratch steps and rank slices,
    reduced by reading the peers' memory; scaled like an Average."""
    single_copy = current().algorithms.single_copy
    if single_copy is None:
        pytest.skip("no peers, or the kernel refuses process_vm_readv here")
    lengths = [5, 0, 300_001, 1, 17, 0, 140_000, 2]
    arrays = [rank_values("float64", (n,), rank, 90 + i, -2, 2) for i, n in enumerate(lengths)]
    expected = [expected_reduction("float64", n, 90 + i, op, size, -2, 2) * 0.5 for i, n in enumerate(lengths)]
    outputs = arrays if in_place else [np.full_like(a, np.nan) for a in arrays]
    inputs = [a.copy() for a in arrays]
    single_copy.allreduce_arrays(arrays, op, 0.5, None if in_place else outputs)
    for output, want in zip(outputs, expected):
        np.testing.assert_allclose(output, want, rtol=1e-12)
    if not in_place:
        for array, before in zip(arrays, inputs):
            np.testing.assert_array_equal(array, before)


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "hierarchical"])
def test_ranks_waiting_for_a_late_peer_leave_the_core_to_others(algorithm, rank, size):
    # Where ranks outnumber cores, a rank that spins in MPI while a peer still prepares its
    # data takes the core from that peer (testkit.late_peer holds the limit and its margin).
    if size == 1:
        pytest.skip("needs a peer")
    layer = current().algorithms
    data = np.full((4 << 20) // 4, rank + 1, np.float32)
    result = np.empty_like(data)
    waited, cpu = late_peer.wait_for_late_peer(
        lambda: layer.reduce(data, hvd.Sum, result, algorithm=algorithm), layer.comm.Barrier, rank == size - 1)
    np.testing.assert_array_equal(result, np.full_like(data, size * (size + 1) / 2))
    if rank != size - 1:
        late_peer.check_share(waited, cpu, f"a {algorithm} all-reduce of 4 MiB")
