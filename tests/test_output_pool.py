"""Result buffers are recycled only when no view of them is left."""

import numpy as np

from hvdplus.comm.output_pool import OutputPool


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
