"""Result buffers are recycled only when no view of them is left."""

import numpy as np

from hvdplus.comm.output_pool import OutputPool, aligned_layout


def address(array):
    return array.__array_interface__["data"][0]


def test_buffer_is_reused_once_every_view_is_dropped():
    pool = OutputPool(min_bytes=16)
    first = pool.empty((4, 4), np.dtype(np.float32))
    where = address(first)
    row = first[1]
    del first
    assert address(pool.empty((4, 4), np.dtype(np.float32))) != where  # a row still points into it
    del row
    again = pool.empty((8, 2), np.dtype(np.float32))
    assert address(again) == where and again.shape == (8, 2)


def test_small_results_and_full_pools_are_not_recycled():
    pool = OutputPool(min_bytes=1024, max_buffers=1)
    small = pool.empty((4,), np.dtype(np.float64))
    assert small.base is None
    held = [pool.empty((512,), np.dtype(np.float32)) for _ in range(3)]
    assert len({address(a) for a in held}) == 3
    assert len(pool) == 1  # the others were handed out without being retained


def test_a_full_pool_makes_room_by_dropping_an_unused_buffer():
    pool = OutputPool(min_bytes=16, max_buffers=2)
    kept = pool.empty((64,), np.dtype(np.float32))
    dropped = pool.empty((32,), np.dtype(np.float32))
    del dropped
    newest = pool.empty((16,), np.dtype(np.float32))
    where = address(newest)
    assert len(pool) == 2  # the unused 32-element buffer made room for the newest one
    del newest
    assert address(pool.empty((16,), np.dtype(np.float32))) == where
    assert kept.size == 64
    # Byte budget: a buffer that would exceed it is handed out without being retained.
    small_budget = OutputPool(min_bytes=16, max_bytes=1024)
    held = small_budget.empty((200,), np.dtype(np.float32))
    extra = small_budget.empty((200,), np.dtype(np.float32))
    assert len(small_budget) == 1 and address(held) != address(extra)


def test_results_start_on_64_byte_boundaries():
    # TensorFlow copies a numpy result that is not aligned so; glibc's large blocks are not.
    pool = OutputPool(min_bytes=16)
    for count in (5, 300_000, 525_000):
        held = pool.empty((count,), np.dtype(np.float32))
        assert address(held) % 64 == 0
        del held
        assert address(pool.empty((count,), np.dtype(np.float32))) % 64 == 0


def test_aligned_layout_starts_every_member_on_a_64_byte_boundary():
    # float32: 16 elements to 64 bytes; float64: 8.
    assert aligned_layout([3, 16, 1], 4) == ([0, 16, 32], 33)
    assert aligned_layout([9, 1], 8) == ([0, 16], 17)
    assert aligned_layout([100], 2) == ([0], 100)
