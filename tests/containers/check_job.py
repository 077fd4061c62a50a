"""Run in every rank of a job across containers (tests/test_containers.py): checks this
rank's place against the slots per host given, then every collective against numpy, with
arrays large enough for the hierarchical all-reduce across the hosts and the shared
window within them. Prints one line per rank: "checked <rank> on <host>"."""

import json
import socket
import sys

import numpy as np

import hvdplus as hvd


def expected_place(slots, rank):
    """(local rank, local size, cross rank, cross size) of job rank `rank`."""
    host = next(i for i in range(len(slots)) if rank < sum(slots[:i + 1]))
    local_rank = rank - sum(slots[:host])
    hosts_with_that_local_rank = [i for i, count in enumerate(slots) if count > local_rank]
    return local_rank, slots[host], hosts_with_that_local_rank.index(host), len(hosts_with_that_local_rank)


def main():
    slots = json.loads(sys.argv[1])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert size == sum(slots), (size, slots)
    place = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    assert place == expected_place(slots, rank), (rank, place, expected_place(slots, rank))
    assert hvd.is_homogeneous() == (len(set(slots)) == 1)

    def data(r, n):
        return np.random.default_rng([r, n]).standard_normal(n).astype(np.float32)

    for n in (7, 50_000, 600_000):  # below and above the crossovers
        total = np.sum([data(r, n) for r in range(size)], axis=0, dtype=np.float64)
        np.testing.assert_allclose(hvd.allreduce(data(rank, n), op=hvd.Sum, name=f"sum.{n}"), total,
                                   rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(hvd.allgather(np.full((rank + 1, 2), rank), name="gather"),
                                  np.concatenate([np.full((r + 1, 2), r) for r in range(size)]))
    np.testing.assert_array_equal(hvd.broadcast(np.full(3, rank), root_rank=size - 1, name="bcast"),
                                  np.full(3, size - 1))
    received, _ = hvd.alltoall(np.full((size, 1), rank), name="alltoall")
    np.testing.assert_array_equal(received[:, 0], np.arange(size))
    rows = hvd.reducescatter(np.ones((2 * size, 2)), op=hvd.Sum, name="scatter")
    np.testing.assert_array_equal(rows, np.full((2, 2), size))
    assert hvd.allgather_object(socket.gethostname(), name="hosts")[rank] == socket.gethostname()
    print(f"checked {rank} on {socket.gethostname()}", flush=True)


if __name__ == "__main__":
    main()
