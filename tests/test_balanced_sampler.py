"""The index arithmetic of `hvdplus.torch.BalancedSampler` (hvdplus/common/batch_shares.py), in
one process, for several ranks at once: whatever sequence of local sizes the batches of an
epoch see, the ranks' shares cover every sample once. The sampler itself, with a real
balancer on real ranks: tests/mpi/test_torch_load_balance.py."""

import itertools
import random
import re

import numpy as np
import pytest

from hvdplus.common.batch_shares import epoch_order, epoch_shares, partial_batch_sizes


def sizes_in_turn(sequence):
    """A `current_sizes` that gives the next list of `sequence` at each call (the last one
    from then on), as a balancer's `sizes` would after a rebalance between batches."""
    calls = itertools.chain(sequence, itertools.repeat(sequence[-1]))
    return lambda: next(calls)


def every_ranks_batches(length, sequence, drop_last=False, shuffle=True, seed=0, epoch=0):
    order = epoch_order(length, shuffle, seed, epoch)
    ranks = len(sequence[0])
    return [[order[start:stop].tolist() for start, stop in epoch_shares(length, sizes_in_turn(sequence), rank,
                                                                          ranks, drop_last)]
            for rank in range(ranks)]


def random_sizes(rng, ranks, global_batch, minimum=1):
    cuts = sorted(rng.randint(0, global_batch - ranks * minimum) for _ in range(ranks - 1))
    return [b - a + minimum for a, b in zip([0] + cuts, cuts + [global_batch - ranks * minimum])]


SEQUENCES = {
    "uneven-fixed": [[5, 17, 42]],
    "changing-every-batch": [[5, 17, 42], [42, 17, 5], [21, 22, 21], [1, 1, 62], [30, 30, 4]],
    "two-ranks-shifting": [[32, 32], [40, 24], [48, 16], [43, 21]],
    "a-rank-with-none": [[0, 30, 34], [10, 0, 54]],
    "one-rank": [[64]],
}


@pytest.mark.parametrize("length", [0, 1, 2, 63, 64, 65, 200, 641])
@pytest.mark.parametrize("name", list(SEQUENCES))
def test_the_ranks_cover_every_sample_once(name, length):
    sequence = SEQUENCES[name]
    batches = every_ranks_batches(length, sequence)
    # Every rank takes the same number of steps, ceil(length / global batch).
    expected_steps = -(-length // sum(sequence[0]))
    assert [len(rank_batches) for rank_batches in batches] == [expected_steps] * len(batches)
    taken = [index for rank_batches in batches for batch in rank_batches for index in batch]
    np.testing.assert_array_equal(np.sort(taken), np.arange(length))
    # A full global batch gives each rank exactly its size at that batch.
    for step in range(length // sum(sequence[0])):
        sizes = sequence[min(step, len(sequence) - 1)]
        assert [len(batches[rank][step]) for rank in range(len(sizes))] == sizes


@pytest.mark.parametrize("seed", range(100))
def test_random_sizes_changing_every_batch_cover_every_sample_once(seed):
    rng = random.Random(seed)
    ranks, global_batch = rng.randint(1, 6), rng.randint(6, 80)
    length = rng.randint(0, 10 * global_batch)
    sequence = [random_sizes(rng, ranks, global_batch) for _ in range(rng.randint(1, 12))]
    for drop_last in (False, True):
        batches = every_ranks_batches(length, sequence, drop_last=drop_last, seed=seed)
        taken = np.sort([index for rank_batches in batches for batch in rank_batches for index in batch])
        covered = length - length % global_batch if drop_last else length
        assert len(taken) == covered and len(set(taken.tolist())) == covered
        assert set(range(length)) >= set(taken.tolist())
        assert len({len(rank_batches) for rank_batches in batches}) == 1


def test_the_last_partial_batch_is_split_in_proportion_or_dropped():
    batches = every_ranks_batches(150, [[5, 17, 42]], drop_last=True, shuffle=False)
    assert [len(rank_batches) for rank_batches in batches] == [2, 2, 2]
    taken = sorted(index for rank_batches in batches for batch in rank_batches for index in batch)
    assert taken == list(range(128))
    # Without shuffling, each batch is contiguous in rank order.
    assert batches[0][1] == list(range(64, 69)) and batches[2][0] == list(range(22, 64))
    # Kept, the last 22 samples split as 1.72, 5.84 and 14.44 round: 2, 6 and 14, in rank order.
    kept = every_ranks_batches(150, [[5, 17, 42]], shuffle=False)
    assert [rank_batches[-1] for rank_batches in kept] == [[128, 129], list(range(130, 136)), list(range(136, 150))]


@pytest.mark.parametrize("sizes, count, expected", [
    ([5, 17, 42], 22, [2, 6, 14]),      # quotas 1.72, 5.84, 14.44: the largest remainders take the spares
    ([5, 17, 42], 3, [1, 1, 1]),        # one sample for each rank before any proportion
    ([5, 17, 42], 2, [0, 1, 1]),        # fewer samples than ranks: 0.16, 0.53, 1.31, so rank 0 gets none
    ([0, 30, 34], 10, [0, 5, 5]),       # a rank of size 0 gets none; 4.69 and 5.31 round to 5 and 5
    ([32, 32], 63, [32, 31]),           # equal remainders: the lower rank first
    ([5, 17, 42], 64, [5, 17, 42]),     # a full batch: the sizes themselves
])
def test_a_partial_batch_splits_in_proportion(sizes, count, expected):
    assert partial_batch_sizes(sizes, count) == expected


@pytest.mark.parametrize("seed", range(100))
def test_partial_shares_stay_within_one_of_their_proportion(seed):
    rng = random.Random(seed)
    ranks, global_batch = rng.randint(1, 7), rng.randint(7, 90)
    sizes = random_sizes(rng, ranks, global_batch)
    count = rng.randint(1, global_batch)
    shares = partial_batch_sizes(sizes, count)
    assert sum(shares) == count
    exact = np.array(sizes) * count / global_batch
    if count >= ranks:
        assert min(shares) >= 1
        # the one-sample floor moves a share by at most its own rounding and the lifts of others
        assert np.all(np.abs(np.array(shares) - exact) < 1 + ranks)
    else:
        assert np.all(np.abs(np.array(shares) - exact) < 1)


def test_the_order_is_the_same_for_a_seed_and_epoch_and_differs_between_epochs():
    first = epoch_order(1000, True, 7, 0)
    np.testing.assert_array_equal(np.sort(first), np.arange(1000))
    np.testing.assert_array_equal(first, epoch_order(1000, True, 7, 0))
    assert not np.array_equal(first, epoch_order(1000, True, 7, 1))
    assert not np.array_equal(first, epoch_order(1000, True, 8, 0))
    np.testing.assert_array_equal(epoch_order(5, False, 7, 3), np.arange(5))


@pytest.mark.parametrize("sizes, rank, ranks", [
    ([3, 4], 2, 2),       # a rank past the sizes
    ([3, -1], 0, 2),      # a negative size
    ([0, 0], 1, 2),       # nothing to share
    ([], 0, 1),
    ([3, 4, 5], 0, 2),    # sizes for three ranks in a job of two: a balancer not reset after a resize
])
def test_sizes_that_cannot_be_shared_name_the_rank_and_the_sizes(sizes, rank, ranks):
    with pytest.raises(ValueError, match=f"rank {rank} of {ranks} cannot take a share .* local sizes "
                                         f"{re.escape(str(sizes))}.*reset the balancer"):
        list(epoch_shares(10, lambda: sizes, rank, ranks))
