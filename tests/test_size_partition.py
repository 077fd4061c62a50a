"""hvdplus.common.size_partition, which deals ZeroRedundancyOptimizer's parameters over the
ranks: against an exhaustive search for the best split of small cases, and its own bounds."""

import itertools
import random

import pytest

from hvdplus.common.size_partition import owned_by, partition_by_size


def shares(sizes, owner_of, owners):
    return [sum(size for size, owner in zip(sizes, owner_of) if owner == o) for o in range(owners)]


def test_largest_first_to_the_least_held():
    # 35 to owner 0; 21, 7, 6 and 3 to owner 1 (which holds less than 35 until 37); 2 to owner 0.
    sizes = [35, 7, 21, 3, 6, 2]
    assert partition_by_size(sizes, 2) == [0, 1, 1, 1, 1, 0]
    assert shares(sizes, partition_by_size(sizes, 2), 2) == [37, 37]
    assert partition_by_size(sizes, 4) == [0, 2, 1, 3, 3, 2]


@pytest.mark.parametrize("owners", [1, 2, 3, 4, 7])
def test_every_item_owned_once_and_the_largest_share_bounded(owners):
    rng = random.Random(owners)
    for _ in range(50):
        sizes = [rng.randint(0, 1000) for _ in range(rng.randint(0, 20))]
        owner_of = partition_by_size(sizes, owners)
        assert sorted(i for o in range(owners) for i in owned_by(owner_of, o)) == list(range(len(sizes)))
        held = shares(sizes, owner_of, owners)
        # Greedy's bound: the largest share exceeds the smallest by at most the largest item.
        assert max(held) - min(held) <= max(sizes, default=0)
        assert partition_by_size(sizes, owners) == owner_of  # the same on every call (every rank)


def test_small_cases_within_four_thirds_of_the_best_split():
    rng = random.Random(3)
    for _ in range(30):
        sizes = [rng.randint(1, 50) for _ in range(7)]
        best = min(max(shares(sizes, split, 3)) for split in itertools.product(range(3), repeat=len(sizes)))
        assert max(shares(sizes, partition_by_size(sizes, 3), 3)) <= best * 4 / 3  # Graham's LPT bound


def test_no_owner_is_refused():
    with pytest.raises(ValueError, match="owners must be at least 1"):
        partition_by_size([1, 2], 0)
