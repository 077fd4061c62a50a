"""The engine under real ranks: random submission orders, fusion, groups, join, handles."""

import numpy as np
import pytest

import hvdplus as hvd
from hvdplus.core.runtime import current

from testkit import late_peer
from testkit.rank_data import rank_values

DTYPES = ["float32", "float64", "int32", "float16"]


def tensor_spec(index):
    dtype = DTYPES[index % len(DTYPES)]
    shape = [(), (5,), (3, 4), (0,), (17,)][index % 5]
    op = hvd.Sum if dtype == "int32" else [hvd.Sum, hvd.Average, hvd.Max][index % 3]
    return dtype, shape, op


def expected_allreduce(dtype, shape, op, seed, size):
    stack = np.stack([rank_values(dtype, shape, r, seed).astype(np.float64) for r in range(size)])
    return {hvd.Sum: stack.sum(0), hvd.Average: stack.mean(0), hvd.Max: stack.max(0)}[op]


@pytest.mark.parametrize("step_count", [4])
def test_random_submission_orders_of_many_named_tensors(rank, size, step_count):
    count = 120
    rng = np.random.default_rng([7, rank])  # every rank shuffles differently
    for step in range(step_count):
        order = rng.permutation(count)
        handles = {}
        for index in order:
            dtype, shape, op = tensor_spec(index)
            data = rank_values(dtype, shape, rank, seed=1000 * step + index)
            handles[index] = hvd.allreduce_async(data, name=f"grad/{index}", op=op)
        for index in rng.permutation(count):
            dtype, shape, op = tensor_spec(index)
            result = hvd.synchronize(handles[index])
            expected = expected_allreduce(dtype, shape, op, 1000 * step + index, size)
            assert result.dtype == np.dtype(dtype) and result.shape == shape
            if dtype == "int32":
                np.testing.assert_array_equal(result, expected.astype(np.int32))
            else:
                tol = 1e-2 if dtype == "float16" else 1e-5
                np.testing.assert_allclose(result.astype(np.float64), expected, rtol=tol, atol=tol)


def test_mixed_collectives_in_random_orders(rank, size):
    rng = np.random.default_rng([8, rank])
    jobs = {
        "gather": lambda: hvd.allgather_async(np.full((rank + 1, 2), rank), name="mixed/gather"),
        "bcast": lambda: hvd.broadcast_async(np.full(3, rank), root_rank=size - 1, name="mixed/bcast"),
        "a2a": lambda: hvd.alltoall_async(np.arange(size) + 10 * rank, name="mixed/a2a"),
        "rs": lambda: hvd.reducescatter_async(np.ones((size, 2)), op=hvd.Sum, name="mixed/rs"),
        "sum": lambda: hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="mixed/sum"),
    }
    keys = list(jobs)
    handles = {key: jobs[key]() for key in rng.permutation(keys)}
    gathered = hvd.synchronize(handles["gather"])
    np.testing.assert_array_equal(gathered, np.concatenate([np.full((r + 1, 2), r) for r in range(size)]))
    np.testing.assert_array_equal(hvd.synchronize(handles["bcast"]), np.full(3, size - 1))
    received, splits = hvd.synchronize(handles["a2a"])
    np.testing.assert_array_equal(received, [rank + 10 * r for r in range(size)])
    np.testing.assert_array_equal(splits, [1] * size)
    np.testing.assert_array_equal(hvd.synchronize(handles["rs"]), np.full((1, 2), size))
    np.testing.assert_array_equal(hvd.synchronize(handles["sum"]), np.full(4, size))


def test_grouped_allreduce_returns_every_member(rank, size):
    arrays = [np.full(3, rank, dtype=np.float32), np.full((2, 2), rank + 1.0), np.arange(4, dtype=np.int32)]
    results = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="group/a")
    total = size * (size - 1) / 2
    np.testing.assert_array_equal(results[0], np.full(3, total, dtype=np.float32))
    np.testing.assert_array_equal(results[1], np.full((2, 2), total + size))
    np.testing.assert_array_equal(results[2], np.arange(4) * size)
    handle = hvd.grouped_allreduce_async(arrays[:2], op=hvd.Max)
    assert [r.max() for r in hvd.synchronize(handle)] == [size - 1, size]


def test_grouped_allreduce_packs_members_and_keeps_their_dtypes(rank, size):
    seeds = range(4)
    specs = [("float32", (5, 3)), ("float16", (7,)), ("float32", ()), ("float32", (0, 2))]
    arrays = [rank_values(dtype, shape, rank, seed) for (dtype, shape), seed in zip(specs, seeds)]
    results = hvd.grouped_allreduce(arrays, op=hvd.Average, postscale_factor=2.0, name="group/packed")
    for (dtype, shape), seed, result in zip(specs, seeds, results):
        expected = 2.0 * np.mean([rank_values(dtype, shape, r, seed).astype(np.float64) for r in range(size)], axis=0)
        assert result.dtype == np.dtype(dtype) and result.shape == shape
        np.testing.assert_allclose(result, expected, rtol=2e-3 if dtype == "float16" else 1e-6)
    # In place, as torch's grouped_allreduce_ and the optimizers use it.
    outputs = [np.full(4, rank + 1.0), np.full((2, 3), float(rank), dtype=np.float32)]
    hvd.synchronize(hvd.grouped_allreduce_async(outputs, op=hvd.Sum, outputs=outputs, name="group/in place"))
    np.testing.assert_array_equal(outputs[0], np.full(4, size * (size + 1) / 2))
    np.testing.assert_array_equal(outputs[1], np.full((2, 3), size * (size - 1) / 2))
    assert hvd.grouped_allreduce([], name="group/empty") == []


@pytest.mark.parametrize("shapes", [
    [(256, 256), (256,), (3, 5), (0,), (40_000,), (7,)],
    [(256, 256)] + [(2000,), (3, 5)] * 10,
], ids=["small-members-in-one-mpi-call", "small-members-through-the-window"])
def test_grouped_allreduce_in_place_where_members_lie(shapes, rank, size):
    # In place, float32, no prescale: on one node reduced member by member, with sizes that
    # take one MPI call each (64 KiB - 16 MiB), and small ones packed into one MPI call
    # (under 64 KiB together) or reduced through the shared window.
    arrays = [rank_values("float32", shape, rank, 50 + i) for i, shape in enumerate(shapes)]
    results = hvd.synchronize(hvd.grouped_allreduce_async(arrays, name="group/where", outputs=arrays))
    for i, (shape, array, result) in enumerate(zip(shapes, arrays, results)):
        want = np.mean([rank_values("float32", shape, r, 50 + i).astype(np.float64) for r in range(size)], axis=0)
        assert result is array
        np.testing.assert_allclose(array, want, rtol=1e-5, atol=1e-6)


def test_group_average_into_new_results_equals_the_sum_divided_bit_for_bit(rank, size):
    # A group with new results (float32 members) is reduced from where its members lie on
    # one node (engine algorithm shm), else packed: averaged while packed on a power-of-two
    # number of ranks, divided after the sum elsewhere. Each way the bits equal float32
    # sum-then-divide (exactly where the order of MPI's sum cannot differ: 2 ranks), and the
    # results start on 64-byte boundaries (TensorFlow takes them without a copy).
    shapes = [(256, 256), (256,), (3, 5), (10,)]
    arrays = [rank_values("float32", shape, rank, 70 + i, -1e3, 1e3) for i, shape in enumerate(shapes)]
    results = hvd.grouped_allreduce(arrays, name="group/average")
    for i, (shape, result) in enumerate(zip(shapes, results)):
        total = np.zeros(shape, np.float32)
        for r in range(size):
            total += rank_values("float32", shape, r, 70 + i, -1e3, 1e3)
        if size <= 2:
            np.testing.assert_array_equal(result, total / np.float32(size))
        else:
            np.testing.assert_allclose(result, total / np.float32(size), rtol=1e-6, atol=1e-4)
    # (3, 5) is 60 bytes: the member after it starts on the next boundary all the same.
    assert [result.__array_interface__["data"][0] % 64 for result in results] == [0] * len(shapes)
    # Averaged while packed, a sum beyond float32's range is no longer in the way.
    huge = hvd.grouped_allreduce([np.full(4, 3e38, np.float32), np.ones(2, np.float32)], name="group/huge")[0]
    if size & (size - 1) == 0 and current().algorithms.engine_algorithm != "shm":
        np.testing.assert_array_equal(huge, np.full(4, 3e38, np.float32))
    # Fused with an all-reduce that divides after the sum: each keeps its own scaling.
    plain = hvd.allreduce_async(np.full(5, rank + 1.0, np.float32), name="plain average")
    packed = hvd.grouped_allreduce_async([np.full(3, rank + 1.0, np.float32), np.ones(2, np.float32)],
                                         name="group/beside")
    np.testing.assert_array_equal(hvd.synchronize(plain), np.full(5, (size + 1) / 2))
    np.testing.assert_array_equal(hvd.synchronize(packed)[0], np.full(3, (size + 1) / 2))


def test_grouped_allreduce_with_some_outputs_and_a_strided_member(rank, size):
    shapes = [(256, 256), (3, 5), (9,)]
    arrays = [rank_values("float32", shape, rank, 60 + i) for i, shape in enumerate(shapes)]
    arrays[1] = arrays[1].T  # not contiguous
    originals = [a.copy() for a in arrays]
    outputs = [None, None, np.empty(9, dtype=np.float32)]
    results = hvd.synchronize(hvd.grouped_allreduce_async(arrays, name="group/some", op=hvd.Sum, outputs=outputs))
    for i, (shape, result) in enumerate(zip(shapes, results)):
        want = np.sum([rank_values("float32", shape, r, 60 + i).astype(np.float64) for r in range(size)], axis=0)
        np.testing.assert_allclose(result, want.T if i == 1 else want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(arrays[i], originals[i])  # inputs left alone
    assert results[2] is outputs[2]


def test_grouped_allreduce_with_a_joined_rank(rank, size):
    # The joined last rank stands in with zeros member by member, as the others reduce an
    # in-place group.
    shapes = [(256, 256), (256,), (9,)]
    if rank == size - 1:
        hvd.join()
        return
    arrays = [np.full(shape, rank + 1.0, dtype=np.float32) for shape in shapes]
    hvd.synchronize(hvd.grouped_allreduce_async(arrays, op=hvd.Sum, name="group/joined", outputs=arrays))
    for array, shape in zip(arrays, shapes):
        np.testing.assert_array_equal(array, np.full(shape, sum(range(1, size)), dtype=np.float32))
    hvd.join()


def test_grouped_allreduce_mismatched_member_raises_everywhere(rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    arrays = [np.ones(3, dtype=np.float32), np.ones(4 if rank == 0 else 5, dtype=np.float32)]
    with pytest.raises(hvd.TensorMismatchError,
                       match=r"Mismatched member shapes for 'group/bad'.*rank 0 had \(\(3,\), \(4,\)\)"):
        hvd.grouped_allreduce(arrays, name="group/bad")
    bad_member = np.ones(2, dtype=np.int32) if rank == 1 else np.ones(2, dtype=np.float32)
    with pytest.raises(hvd.TensorMismatchError, match="Mismatched member dtypes for 'group/int'"):
        hvd.grouped_allreduce([np.ones(2), bad_member], name="group/int")
    np.testing.assert_array_equal(hvd.grouped_allreduce([np.ones(2)], op=hvd.Sum)[0], np.full(2, size))


def test_duplicate_name_in_flight_is_refused_at_submit(rank, size):
    handle = hvd.allreduce_async(np.ones(2), name="dup", op=hvd.Sum)
    with pytest.raises(ValueError, match="'dup' is already in flight"):
        hvd.allreduce_async(np.ones(2), name="dup")
    np.testing.assert_array_equal(hvd.synchronize(handle), np.full(2, size))
    # Once synchronized, the name is free again.
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), name="dup", op=hvd.Sum), np.full(2, size))


def test_poll_turns_true_and_synchronize_returns(rank, size):
    handle = hvd.allreduce_async(np.ones(8), name="polled", op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    np.testing.assert_array_equal(hvd.synchronize(handle), np.full(8, size))


def test_rank_blocked_outside_hvdplus_still_completes_its_collectives(rank, size):
    # Rank 0 never waits on its handle until rank 1 has its result: rank 0's engine thread
    # must run the all-reduce on its own, even where collectives are held for waiters.
    from mpi4py import MPI
    handle = hvd.allreduce_async(np.full(4, rank + 1.0), name="background", op=hvd.Sum)
    if rank == 0:
        received = MPI.COMM_WORLD.recv(source=size - 1, tag=77) if size > 1 else None
    else:
        result = hvd.synchronize(handle)
        if rank == size - 1:
            MPI.COMM_WORLD.send(result, dest=0, tag=77)
    expected = np.full(4, size * (size + 1) / 2)
    np.testing.assert_array_equal(hvd.synchronize(handle), expected)
    if rank == 0 and size > 1:
        np.testing.assert_array_equal(received, expected)


def test_async_mismatch_raises_everywhere_and_later_work_goes_on(rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    bad = hvd.allreduce_async(np.zeros(rank + 2), name="async/bad")
    good = hvd.allreduce_async(np.ones(3), name="async/good", op=hvd.Sum)
    with pytest.raises(hvd.TensorMismatchError, match=r"Mismatched shapes for 'async/bad'.*rank 0 had \(2,\)"):
        hvd.synchronize(bad)
    np.testing.assert_array_equal(hvd.synchronize(good), np.full(3, size))


def test_many_tensors_are_fused_and_still_exact(rank, size):
    handles = [hvd.allreduce_async(np.full(100, i + rank, dtype=np.int64), name=f"fuse/{i}", op=hvd.Sum)
               for i in range(300)]
    for i, handle in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(100, size * i + size * (size - 1) // 2))


def test_join_with_uneven_steps(rank, size):
    # Rank r has r + 2 batches; the others' all-reduces go on with zeros from joined ranks.
    for step in range(rank + 2):
        result = hvd.allreduce(np.full(3, float(rank + 1)), name=f"join/step{step}", op=hvd.Average)
        active = [r for r in range(size) if r + 2 > step]
        np.testing.assert_allclose(result, np.full(3, sum(r + 1 for r in active) / size))
        if len(active) == size:
            gathered = hvd.allgather(np.full((1, 2), rank), name=f"join/gather{step}")
            np.testing.assert_array_equal(gathered, np.array([[r, r] for r in range(size)]))
        else:  # as in Horovod, allgather fails while a rank has joined
            with pytest.raises(hvd.HvdplusError, match="Allgather is not supported with Join at this time"):
                hvd.allgather(np.full((1, 2), rank), name=f"join/gather{step}")
    last = hvd.join()
    assert last == size - 1
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum, name="after_join"), np.full(2, size))


def test_reduce_beside_a_joined_rank(rank, size):
    # The joined last rank contributes zeros, also when it is the root.
    if rank == size - 1:
        hvd.join()
        return
    for root in range(size):
        result = hvd.reduce(np.full(3, rank + 1.0), root_rank=root, op=hvd.Sum, name=f"reduce/joined{root}")
        if rank == root:
            np.testing.assert_array_equal(result, np.full(3, float(sum(range(1, size)))))
    hvd.join()


@pytest.mark.parametrize("count", [1, 40])  # one tensor alone, or many fused
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_allreduce_into_output_and_in_place(count, dtype, rank, size):
    arrays = [rank_values(dtype, (33,), rank, 90 + i) for i in range(count)]
    expected = [sum(rank_values(dtype, (33,), r, 90 + i).astype(np.float64) for r in range(size))
                for i in range(count)]
    handles = [hvd.allreduce_async(a, name=f"inplace/{i}", op=hvd.Sum, output=a) for i, a in enumerate(arrays)]
    for handle, array, want in zip(handles, arrays, expected):
        assert hvd.synchronize(handle) is array
        tol = 1e-2 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(array.astype(np.float64), want, rtol=tol, atol=tol)
    target = np.zeros(5)
    assert hvd.synchronize(hvd.allreduce_async(np.ones(5), name="into", op=hvd.Sum, output=target)) is target
    np.testing.assert_array_equal(target, np.full(5, size))


def test_output_that_does_not_match_is_refused_everywhere(rank):
    output = np.zeros(4 if rank == 0 else 3)
    if hvd.size() < 2:
        pytest.skip("needs two ranks")
    with pytest.raises(ValueError, match="rank 1: allreduce .bad_output.: output has shape"):
        hvd.synchronize(hvd.allreduce_async(np.ones(4), name="bad_output", output=output))


def test_a_rank_waiting_in_the_engine_for_a_late_peer_leaves_the_core_to_others(rank, size):
    # The caller drives the engine for a while and the engine thread cycles while a collective
    # is in flight: both back off while nothing moves (testkit.late_peer holds the limit).
    if size == 1:
        pytest.skip("needs a peer")
    data = np.full(1024, rank + 1, np.float32)
    hvd.allreduce(data, op=hvd.Sum, name="late_peer.engine")  # agreed once: the wait below is the peer's
    waited, cpu = late_peer.wait_for_late_peer(
        lambda: hvd.allreduce(data, op=hvd.Sum, name="late_peer.engine"), current().algorithms.comm.Barrier,
        rank == size - 1)
    if rank != size - 1:
        late_peer.check_share(waited, cpu, "hvd.allreduce of 4 KiB through the engine")
