"""The state dicts of ZeroRedundancyOptimizer: a rank's shard, and the full, torch-style dict
made of all shards; each converts to the other at any number of ranks.

A full dict is what torch.optim optimizers save: {"state": {index: ...}, "param_groups":
[{hyper-parameters, "params": [index, ...]}]}, the indices counting every parameter of every
group in order. A shard is the same with the state of its rank's parameters only, and a
"zero_shard" entry that says which: {"rank", "size", "owned": [index, ...], "num_parameters"}.
"""

from typing import Dict, List, Sequence

__all__ = ["SHARD_KEY", "is_shard", "make_shard", "merged", "inner_part", "check_layout"]

SHARD_KEY = "zero_shard"


def is_shard(state_dict) -> bool:
    """Whether `state_dict` is one rank's shard (rather than a full dict)."""
    return isinstance(state_dict, dict) and SHARD_KEY in state_dict


def make_shard(inner: dict, global_of_local: Sequence[int], group_params: Sequence[Sequence[int]],
               rank: int, size: int, num_parameters: int) -> dict:
    """A rank's shard, from its inner optimizer's state dict.

    Args:
        inner: the inner optimizer's state_dict(), which numbers the rank's parameters 0, 1, ...
        global_of_local: the global index of each of them, in that order.
        group_params: the global indices of every parameter of each group (all ranks').
        rank, size: this rank's place in the set, and the set's size.
        num_parameters: how many parameters all groups hold together.
    """
    groups = []
    for inner_group, params in zip(inner["param_groups"], group_params):
        group = {key: value for key, value in inner_group.items() if key != "params"}
        group["params"] = list(params)
        groups.append(group)
    return {
        "state": {global_of_local[local]: value for local, value in inner["state"].items()},
        "param_groups": groups,
        SHARD_KEY: {"rank": rank, "size": size, "owned": sorted(global_of_local), "num_parameters": num_parameters},
    }


def merged(shards: Sequence[dict]) -> dict:
    """The full dict that `shards` (of one checkpoint, in any order, one per rank that saved
    it) make together; ValueError if they are of different checkpoints or leave a parameter
    out."""
    if not shards:
        raise ValueError("ZeroRedundancyOptimizer: no shard to merge")
    first = shards[0][SHARD_KEY]
    state: Dict[int, dict] = {}
    covered = set()
    for shard in shards:
        meta = shard[SHARD_KEY]
        if meta["num_parameters"] != first["num_parameters"] or meta["size"] != first["size"]:
            raise ValueError(
                f"ZeroRedundancyOptimizer: shards of different checkpoints: shard of rank {first['rank']} of "
                f"{first['size']} has {first['num_parameters']} parameters, shard of rank {meta['rank']} of "
                f"{meta['size']} has {meta['num_parameters']}")
        covered.update(meta["owned"])
        state.update(shard["state"])
    missing = sorted(set(range(first["num_parameters"])) - covered)
    if missing:
        ranks = sorted({shard[SHARD_KEY]["rank"] for shard in shards})
        raise ValueError(
            f"ZeroRedundancyOptimizer: the shards of ranks {ranks} (of a checkpoint saved at {first['size']} "
            f"ranks) leave out parameters {missing[:10]}{' ...' if len(missing) > 10 else ''}; load a "
            "consolidated dict (consolidate_state_dict), or every rank's shard")
    return {"state": {index: state[index] for index in sorted(state)},
            "param_groups": [dict(group) for group in shards[0]["param_groups"]]}


def check_layout(full: dict, group_sizes: Sequence[int]) -> None:
    """ValueError unless `full`'s groups hold as many parameters as this optimizer's."""
    sizes = [len(group["params"]) for group in full["param_groups"]]
    if sizes != list(group_sizes):
        raise ValueError(
            f"ZeroRedundancyOptimizer.load_state_dict: the dict's parameter groups hold {sizes} parameters, "
            f"this optimizer's hold {list(group_sizes)}")


def inner_part(full: dict, local_spots: Sequence[Sequence[int]]) -> dict:
    """The inner optimizer's state dict for the parameters a rank owns, from a full dict.

    Args:
        full: a full dict (merged or consolidated), checked by check_layout.
        local_spots: for each group, the places in it of the rank's parameters, in the order
            the inner optimizer holds them; the dict's group lists name each place's index.
    """
    groups: List[dict] = []
    state = {}
    local = 0
    for group, spots in zip(full["param_groups"], local_spots):
        hyper = {key: value for key, value in group.items() if key != "params"}
        hyper["params"] = list(range(local, local + len(spots)))
        for spot in spots:
            saved_index = group["params"][spot]
            if saved_index in full["state"]:
                state[local] = full["state"][saved_index]
            local += 1
        groups.append(hyper)
    return {"state": state, "param_groups": groups}
