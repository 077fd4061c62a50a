"""Node and cross-node ranks against what the job layout implies.

Run plainly, all ranks share this machine: one node. With HVDPLUS_RANKS_PER_NODE=k,
blocks of k consecutive ranks pose as nodes, as multi-node hierarchical code will see them.
"""

import os

import hvdplus as hvd


def expected_layout(size):
    per_node = int(os.environ.get("HVDPLUS_RANKS_PER_NODE", "0")) or size
    nodes = [list(range(start, min(start + per_node, size))) for start in range(0, size, per_node)]
    return nodes


def test_local_and_cross_ranks_follow_the_layout(rank, size):
    nodes = expected_layout(size)
    node = next(index for index, members in enumerate(nodes) if rank in members)
    local = nodes[node].index(rank)
    assert hvd.local_rank() == local
    assert hvd.local_size() == len(nodes[node])
    # Nodes holding a rank with this local rank, in node order.
    peers = [index for index, members in enumerate(nodes) if len(members) > local]
    assert hvd.cross_size() == len(peers)
    assert hvd.cross_rank() == peers.index(node)
    assert hvd.is_homogeneous() == (len({len(members) for members in nodes}) == 1)


def test_queries_agree_across_ranks(rank, size):
    assert hvd.allgather_object(hvd.rank()) == list(range(size))
    assert set(hvd.allgather_object(hvd.size())) == {size}
