"""hvdplus.torch.zero_checkpoint, the shard and full state dicts of ZeroRedundancyOptimizer:
shards made from inner optimizers' dicts merge back into the full dict they came from, a full
dict splits into any rank's part, and shards that leave a parameter out are refused. Plain
dicts of numbers stand for the state tensors; one process, no MPI."""

import pytest

from hvdplus.torch.zero_checkpoint import check_layout, inner_part, is_shard, make_shard, merged

# Five parameters in two groups (0, 1 | 2, 3, 4), each with a state of its own index.
FULL = {"state": {index: {"momentum": 10.0 * index} for index in range(5)},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}, {"lr": 0.2, "params": [2, 3, 4]}]}
GROUPS = [[0, 1], [2, 3, 4]]


def shard_of(owned, rank, size):
    """The shard a rank owning `owned` (global indices, in group order) makes."""
    inner = {"state": {local: FULL["state"][index] for local, index in enumerate(owned)},
             "param_groups": [{"lr": 0.1, "params": [i for i, g in enumerate(owned) if g in GROUPS[0]]},
                              {"lr": 0.2, "params": [i for i, g in enumerate(owned) if g in GROUPS[1]]}]}
    return make_shard(inner, owned, GROUPS, rank, size, 5)


def test_shards_merge_into_the_full_dict_in_any_order():
    shards = [shard_of([1, 2], 0, 3), shard_of([0, 4], 1, 3), shard_of([3], 2, 3)]
    assert all(is_shard(shard) for shard in shards) and not is_shard(FULL)
    assert shards[1]["state"] == {0: {"momentum": 0.0}, 4: {"momentum": 40.0}}
    assert merged(shards) == FULL
    assert merged(shards[::-1]) == FULL


def test_a_full_dict_splits_into_each_ranks_part():
    part = inner_part(FULL, [[1], [0, 2]])  # group 0's second; group 1's first and third
    assert part == {"state": {0: {"momentum": 10.0}, 1: {"momentum": 20.0}, 2: {"momentum": 40.0}},
                    "param_groups": [{"lr": 0.1, "params": [0]}, {"lr": 0.2, "params": [1, 2]}]}
    assert inner_part(FULL, [[], []]) == {"state": {}, "param_groups": [{"lr": 0.1, "params": []},
                                                                         {"lr": 0.2, "params": []}]}


def test_shards_that_leave_a_parameter_out_are_refused():
    with pytest.raises(ValueError, match=r"shards of ranks \[0, 2\] .* saved at 3 ranks\) leave out parameters "
                                         r"\[0, 4\]"):
        merged([shard_of([1, 2], 0, 3), shard_of([3], 2, 3)])


def test_shards_of_different_checkpoints_are_refused():
    with pytest.raises(ValueError, match="shards of different checkpoints"):
        merged([shard_of([1, 2], 0, 3), shard_of([0, 3, 4], 1, 2)])


def test_a_dict_of_other_groups_is_refused():
    with pytest.raises(ValueError, match=r"groups hold \[2, 3\] parameters, this optimizer's hold \[3, 2\]"):
        check_layout(FULL, [3, 2])
