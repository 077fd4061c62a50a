"""Process sets of the numpy core: every collective on sets of 1, 2 and 3 ranks, sets used
concurrently, dynamic adding and removing, and the errors. Run at 1-3 ranks with the other
suites, and at 4 ranks on its own (tests/test_mpi_suites.py)."""

import numpy as np
import pytest

import hvdplus as hvd
from hvdplus.core import runtime

from testkit.rank_data import rank_values


def layouts(size):
    """Disjoint sets that cover the job: the evens and the odds; the first rank alone and
    the rest; the first three and the rest (for 4 ranks)."""
    found = [[list(range(0, size, 2)), list(range(1, size, 2))], [[0], list(range(1, size))]]
    if size >= 4:
        found.append([[0, 1, 2], list(range(3, size))])
    # A set of every rank is the global one, and a set is added once: at 2 ranks the first
    # two layouts are the same.
    unique, seen = [], set()
    for layout in found:
        layout = [ranks for ranks in layout if ranks and len(ranks) < size and tuple(ranks) not in seen]
        seen.update(tuple(ranks) for ranks in layout)
        if layout:
            unique.append(layout)
    return unique


@pytest.fixture(scope="module")
def sets():
    """{layout index: [ProcessSet, ...]}, added on every rank in the same order."""
    if hvd.size() < 2:
        pytest.skip("process sets other than the global one need 2 ranks")
    added = {i: [hvd.add_process_set(ranks) for ranks in layout] for i, layout in enumerate(layouts(hvd.size()))}
    yield added
    for layout in added.values():
        for process_set in layout:
            hvd.remove_process_set(process_set)


def registered():
    """{process set id: ranks} of every set the job holds, the global one (0) included."""
    return {set_id: list(ranks) for set_id, ranks in sorted(runtime.current().process_set_ranks.items())}


def assert_running_on_the_global_set_alone(rank, size):
    assert hvd.is_initialized() and (hvd.size(), hvd.rank()) == (size, rank)
    assert registered() == {0: list(range(size))}
    values = {r: rank_values(np.float64, (5,), r, seed=9) for r in range(size)}
    np.testing.assert_allclose(hvd.allreduce(values[rank], op=hvd.Sum), np.sum(list(values.values()), axis=0))


def test_a_refused_init_keeps_the_job_and_a_second_init_adds_exactly_its_list(rank, size):
    from mpi4py import MPI

    # First in the file, before the fixture below adds sets: the job starts afresh here.
    hvd.shutdown()
    world = MPI.COMM_WORLD
    halves = world.Split(color=rank % 2, key=rank)  # each rank's own half, as in Horovod's programs
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    clones = [world.Dup(), halves.Dup()]
    refused = [
        [hvd.ProcessSet(clones[0])],                           # the global set's ranks
        [hvd.ProcessSet(halves), hvd.ProcessSet(clones[1])],   # the halves twice
        [hvd.ProcessSet(halves), hvd.ProcessSet(evens)],       # the evens from the Split and as ranks
        [hvd.ProcessSet([0]), hvd.ProcessSet([0])],            # a rank list twice
    ]
    # The first refusal starts the job, the others meet it running; none leaves a set behind.
    for sets in refused:
        with pytest.raises(ValueError, match=r"init\(process_sets=...\): set \[0.*\]: .* has the same ranks"):
            hvd.init(comm=world, process_sets=sets)
        assert_running_on_the_global_set_alone(rank, size)
        assert all(process_set.process_set_id is None for process_set in sets)
    assert repr(refused[1][0]) == f"ProcessSet(process_set_id=None, ranks=None, mpi_comm={halves})"
    if size > 1:  # rank 0 alone passes a set: every rank raises, none waits for the others
        with pytest.raises(ValueError, match=r"the ranks disagree about the set's ranks: rank 0 passed \[0\]; rank 1 "
                                             "passed no set"):
            hvd.init(comm=world, process_sets=[hvd.ProcessSet([0])] if rank == 0 else [])
        assert_running_on_the_global_set_alone(rank, size)

    # Horovod's order: the communicators' sets first (sorted), then the rank lists.
    valid = ([hvd.ProcessSet(halves)] if size > 1 else []) + ([hvd.ProcessSet([0])] if size > 2 else [])
    hvd.init(comm=world, process_sets=valid)
    expected = {0: list(range(size)), **({1: evens, 2: odds} if size > 1 else {}), **({3: [0]} if size > 2 else {})}
    assert registered() == expected
    assert [process_set.process_set_id for process_set in valid] == [1 + rank % 2, 3][:len(valid)]
    assert [process_set.ranks for process_set in valid] == [evens if rank % 2 == 0 else odds, [0]][:len(valid)]
    assert repr(hvd.global_process_set) == f"ProcessSet(process_set_id=0, ranks={list(range(size))}, mpi_comm={world})"
    values = {r: rank_values(np.float64, (4, 3), r, seed=5) for r in range(size)}
    for process_set in valid:
        if process_set.included():
            expected_sum = np.sum([values[r] for r in process_set.ranks], axis=0)
            np.testing.assert_allclose(hvd.allreduce(values[rank], op=hvd.Sum, process_set=process_set), expected_sum)
    np.testing.assert_allclose(hvd.allreduce(values[rank]), np.mean(list(values.values()), axis=0))
    # Each rank's half is a different set, which remove_process_set (one set on every rank)
    # cannot take: the job starts afresh for the tests below instead.
    hvd.shutdown()
    hvd.init()
    for comm in [halves, *clones]:
        comm.Free()


def test_a_process_set_prints_as_horovods():
    assert repr(hvd.ProcessSet([2, 0])) == "ProcessSet(process_set_id=None, ranks=[0, 2], mpi_comm=None)"
    assert str(hvd.ProcessSet([1])) == "ProcessSet(process_set_id=None, ranks=[1], mpi_comm=None)"


def my_set(layout):
    return next(process_set for process_set in layout if process_set.included())


def set_values(process_set, dtype, shape, seed, rows=None):
    """Each member's data, by job rank, so every member computes the expected results."""
    return {r: rank_values(dtype, ((rows(r),) + shape[1:]) if rows else shape, r, seed) for r in process_set.ranks}


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_every_collective_on_a_set_matches_numpy(sets, layout, rank):
    if layout not in sets:
        pytest.skip("this layout needs more ranks")
    mine = my_set(sets[layout])
    n = mine.size()
    assert mine.rank() == mine.ranks.index(rank) and mine.included()
    values = set_values(mine, np.float64, (5, 3), seed=layout)
    stacked = np.stack([values[r] for r in mine.ranks])

    np.testing.assert_allclose(hvd.allreduce(values[rank], op=hvd.Sum, process_set=mine), stacked.sum(0))
    np.testing.assert_allclose(hvd.allreduce(values[rank], process_set=mine), stacked.mean(0))
    np.testing.assert_allclose(hvd.allreduce(values[rank], op=hvd.Max, process_set=mine), stacked.max(0))
    grouped = hvd.grouped_allreduce([values[rank], 2 * values[rank]], op=hvd.Sum, process_set=mine)
    np.testing.assert_allclose(grouped[1], 2 * stacked.sum(0))

    rows = set_values(mine, np.int32, (0, 2), seed=7, rows=lambda r: r % 3 + 1)
    np.testing.assert_array_equal(hvd.allgather(rows[rank], process_set=mine),
                                  np.concatenate([rows[r] for r in mine.ranks]))
    for root in mine.ranks:
        np.testing.assert_array_equal(hvd.broadcast(values[rank], root_rank=root, process_set=mine), values[root])
        assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=mine) == {"from": root}
    assert hvd.allgather_object(rank, process_set=mine) == mine.ranks

    splits = [1] * n
    received, counts = hvd.alltoall(np.full((n, 2), rank, dtype=np.int64), splits=splits, process_set=mine)
    np.testing.assert_array_equal(received[:, 0], mine.ranks)
    tall = set_values(mine, np.float64, (2 * n, 2), seed=11)
    mine_rows = hvd.reducescatter(tall[rank], op=hvd.Sum, process_set=mine)
    expected = sum(tall[r] for r in mine.ranks)
    me = mine.rank()
    np.testing.assert_allclose(mine_rows, expected[2 * me:2 * me + 2])
    hvd.barrier(process_set=mine)


def test_sets_and_the_global_set_run_concurrently_in_any_order(sets, rank, size):
    # Each rank submits its set's collective and a global one in an order of its own; the
    # set's collective only completes once its members submitted it, independently of
    # where the other set's members stand.
    mine = my_set(sets[0])
    ours = np.full(4, float(rank))
    everyone = np.full(4, 1.0)
    if rank % 2:
        on_set = hvd.allreduce_async(ours, name="concurrent", op=hvd.Sum, process_set=mine)
        on_job = hvd.allreduce_async(everyone, name="concurrent", op=hvd.Sum)
    else:
        on_job = hvd.allreduce_async(everyone, name="concurrent", op=hvd.Sum)
        on_set = hvd.allreduce_async(ours, name="concurrent", op=hvd.Sum, process_set=mine)
    np.testing.assert_array_equal(hvd.synchronize(on_set), np.full(4, float(sum(mine.ranks))))
    np.testing.assert_array_equal(hvd.synchronize(on_job), np.full(4, float(size)))


def test_a_rank_outside_the_set_gets_a_value_error(sets, rank):
    other = next(process_set for process_set in sets[0] if not process_set.included())
    assert other.rank() == -1 and not other.included()
    with pytest.raises(ValueError, match=rf"process set \[.*\], which does not include rank {rank}"):
        hvd.allreduce(np.ones(2), process_set=other)


def test_a_root_outside_the_set_raises_on_every_member(sets, rank):
    mine = my_set(sets[0])
    outsider = next(r for r in range(hvd.size()) if r not in mine.ranks)
    with pytest.raises(ValueError, match=f"rank {outsider} is not in the process set"):
        hvd.broadcast(np.ones(2), root_rank=outsider, process_set=mine)


def test_mismatched_shapes_in_a_set_raise_on_every_member(sets, rank):
    for layout in sets.values():  # in the same order on every rank
        mine = my_set(layout)
        if mine.size() > 1:  # a set of one rank cannot disagree
            with pytest.raises(hvd.TensorMismatchError, match="'uneven'"):
                hvd.allreduce(np.ones(2 + mine.rank()), name="uneven", process_set=mine)


def test_adding_a_set_the_ranks_disagree_about_raises_on_every_rank(sets, rank):
    ranks = [0] if rank == 0 else [0, 1]
    with pytest.raises(ValueError, match="the ranks disagree about the set's ranks"):
        hvd.add_process_set(ranks)


def test_a_set_of_the_same_ranks_cannot_be_added_twice(sets):
    with pytest.raises(ValueError, match="has the same ranks"):
        hvd.add_process_set(sets[0][0].ranks)


def test_a_removed_set_cannot_be_used_and_a_new_one_can(sets, rank, size):
    if size < 3:
        pytest.skip("a pair of ranks other than the global set needs 3 ranks")
    pair = hvd.add_process_set([0, 1])
    if pair.included():
        assert hvd.allreduce(np.array([rank]), op=hvd.Sum, process_set=pair)[0] == 1
    hvd.remove_process_set(pair)
    assert pair.process_set_id is None
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(np.ones(1), process_set=pair)
    again = hvd.add_process_set([0, 1])
    if again.included():
        assert hvd.allreduce(np.array([rank]), op=hvd.Sum, process_set=again)[0] == 1
    hvd.remove_process_set(again)


def test_the_global_set_is_the_whole_job(rank, size):
    assert hvd.global_process_set.ranks == list(range(size))
    assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank
    total = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=hvd.global_process_set)
    assert total[0] == size
    with pytest.raises(ValueError, match="global process set cannot be removed"):
        hvd.remove_process_set(hvd.global_process_set)


@pytest.mark.parametrize("elements", [3, 40_000, 400_000])
def test_large_reductions_on_sets_take_every_algorithm(sets, rank, elements):
    # Sizes on both sides of the crossovers (MPI below 64 KiB, then the shared window and
    # single-copy reads on one node, hierarchical across posed nodes): each set builds
    # the algorithms of its own topology, also for sets that span nodes unevenly.
    for layout in sets.values():  # in the same order on every rank
        mine = my_set(layout)
        values = set_values(mine, np.float32, (elements,), seed=elements)
        expected = np.sum([values[r] for r in mine.ranks], axis=0, dtype=np.float64)
        got = hvd.allreduce(values[rank], op=hvd.Sum, process_set=mine, name=f"large.{elements}")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
