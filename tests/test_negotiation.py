"""The coordinator on hand-made requests: readiness, order, fusion, cache, join."""

import pytest

from hvdplus.common.errors import error_from_wire
from hvdplus.common.reduce_ops import Sum
from hvdplus.engine.negotiation import Coordinator
from hvdplus.engine.protocol import Agreement, Collective, Outcome, Request, Token

JOIN, WAITING, NOT_WAITING = Token.JOIN, Token.WAITING, Token.NOT_WAITING


def allreduce(name, shape=(4,), dtype="float32"):
    agree = Agreement(dtype=dtype, shape=shape, reduce_op=Sum, prescale=1.0, postscale=1.0)
    return Request(Collective.ALLREDUCE, name, agree)


def coordinator(size=2, threshold=1 << 20, cache=16, clock=lambda: 0.0):
    return Coordinator(size, threshold, cache, clock)


def test_name_is_released_only_when_every_rank_submitted_it():
    c = coordinator(size=3)
    c.add(0, [allreduce("a"), allreduce("b")])
    c.add(2, [allreduce("b")])
    assert c.take_batches() == []
    c.add(1, [allreduce("b"), allreduce("a")])
    assert [b.names for b in c.take_batches()] == [["b"]]  # "a" still lacks rank 2
    c.add(2, [allreduce("a")])
    names = [name for batch in c.take_batches() for name in batch.names]
    assert names == ["a"]


def test_ready_allreduces_are_fused_up_to_the_threshold():
    c = coordinator(threshold=40)  # each tensor is 4 float32 = 16 bytes
    for rank in (0, 1):
        c.add(rank, [allreduce(f"t{i}") for i in range(5)])
    batches = c.take_batches()
    assert [batch.names for batch in batches] == [["t0", "t1"], ["t2", "t3"], ["t4"]]


def test_different_dtypes_never_share_a_batch():
    c = coordinator()
    for rank in (0, 1):
        c.add(rank, [allreduce("x"), allreduce("y", dtype="float64"), allreduce("z")])
    assert [batch.names for batch in c.take_batches()] == [["x", "z"], ["y"]]


def test_mismatch_becomes_an_error_batch_naming_ranks():
    c = coordinator()
    c.add(0, [allreduce("w", shape=(2,))])
    c.add(1, [allreduce("w", shape=(3,))])
    (batch,) = c.take_batches()
    error = error_from_wire(batch.error)
    assert type(error).__name__ == "TensorMismatchError"
    assert "rank 0 had (2,), rank 1 had (3,)" in str(error)


def test_cache_ids_replace_requests_after_the_first_agreement():
    c = coordinator()
    for rank in (0, 1):
        c.add(rank, [allreduce("w")])
    (batch,) = c.take_batches()
    cache_id = batch.cache_ids["w"]
    c.add(0, [cache_id])
    c.add(1, [cache_id])
    (again,) = c.take_batches()
    assert again.names == ["w"] and again.cache_ids == {}


def test_a_batch_of_names_every_rank_sent_as_ids_is_known_by_its_ids_alone():
    c = coordinator(size=3)
    for rank in (0, 1, 2):
        c.add(rank, [allreduce("u"), allreduce("v")])
    (first,) = c.take_batches()
    assert first.known_ids is None  # new agreements travel whole
    ids = [first.cache_ids["u"], first.cache_ids["v"]]
    for rank in (0, 1, 2):
        c.add(rank, ids)
    (again,) = c.take_batches()
    assert again.names == ["u", "v"] and again.known_ids == ids
    # One full request (a changed shape) or one joined rank: the batch travels whole.
    c.add(0, [ids[0], allreduce("v", shape=(5,))])
    c.add(1, [ids[0], allreduce("v", shape=(5,))])
    c.add(2, [ids[0], allreduce("v", shape=(5,))])
    (changed,) = c.take_batches()
    assert changed.names == ["u", "v"] and changed.known_ids is None
    c.add(2, [JOIN])
    c.add(0, [ids[0]])
    c.add(1, [ids[0]])
    (joined,) = c.take_batches()
    assert joined.names == ["u"] and joined.known_ids is None


def test_cache_capacity_zero_assigns_no_ids():
    c = coordinator(cache=0)
    for rank in (0, 1):
        c.add(rank, [allreduce("w")])
    assert c.take_batches()[0].cache_ids == {}


def test_joined_ranks_count_as_ready_and_join_completes_with_the_last_rank():
    c = coordinator(size=3)
    c.add(1, [JOIN])
    c.add(0, [allreduce("a")])
    c.add(2, [allreduce("a")])
    (batch,) = c.take_batches()
    assert batch.names == ["a"]
    c.add(2, [JOIN])
    c.add(0, [JOIN])
    (done,) = c.take_batches()
    assert done.kind is Outcome.JOIN_DONE and done.value == 0


def test_alltoall_cannot_run_while_a_rank_has_joined():
    c = coordinator()
    c.add(1, [JOIN])
    c.add(0, [Request(Collective.ALLTOALL, "x", Agreement(dtype="float32", trailing_shape=()), splits=(1, 1))])
    (batch,) = c.take_batches()
    assert "cannot run while ranks [1] have joined" in batch.error[1]


def test_stalled_lists_submitters_and_missing_ranks():
    now = [0.0]
    c = coordinator(size=3, clock=lambda: now[0])
    c.add(0, [allreduce("slow")])
    c.add(2, [allreduce("slow")])
    now[0] = 5.0
    assert c.stalled(older_than=10.0) == []
    now[0] = 12.0
    (stall,) = c.stalled(older_than=10.0)
    assert (stall.kind, stall.name, stall.submitted, stall.missing) == (Collective.ALLREDUCE, "slow", [0, 2], [1])
    assert stall.age == pytest.approx(12.0)


def test_submitted_by_lists_what_a_rank_waits_on():
    c = coordinator(size=2)
    c.add(0, [allreduce("a"), allreduce("b")])
    c.add(1, [allreduce("b"), allreduce("other")])
    c.take_batches()  # releases "b"
    assert c.submitted_by(0) == [(Collective.ALLREDUCE, "a")]
    assert c.submitted_by(1) == [(Collective.ALLREDUCE, "other")]


def test_on_demand_holds_ready_names_until_a_rank_waits_then_fuses_them_all():
    c = Coordinator(2, 1 << 20, 16, lambda: 0.0, release_on_demand=True)
    for rank in (0, 1):
        c.add(rank, [allreduce("a"), allreduce("b")])
    assert c.take_batches() == []
    c.add(1, [WAITING, allreduce("c")])
    c.add(0, [allreduce("c")])
    assert [batch.names for batch in c.take_batches()] == [["a", "b", "c"]]
    c.add(0, [allreduce("d")])
    c.add(1, [allreduce("d")])
    assert [batch.names for batch in c.take_batches()] == [["d"]]  # rank 1 still waits
    c.add(1, [NOT_WAITING])
    for rank in (0, 1):
        c.add(rank, [allreduce("e")])
    assert c.take_batches() == []


def test_on_demand_releases_for_a_wait_that_already_ended():
    # A poll: WAITING and NOT_WAITING both arrived before the coordinator looked.
    c = Coordinator(2, 1 << 20, 16, lambda: 0.0, release_on_demand=True)
    for rank in (0, 1):
        c.add(rank, [allreduce("a")])
    c.add(1, [WAITING])
    c.add(1, [NOT_WAITING])
    assert [batch.names for batch in c.take_batches()] == [["a"]]
