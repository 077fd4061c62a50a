"""Each rank's share of every global batch of an epoch, when the ranks' local batch sizes
change from step to step: the index arithmetic of `hvdplus.torch.BalancedSampler`, free of
any framework.

An epoch walks one permutation of the dataset, the same on every rank, a global batch at a
time. Each global batch is split into contiguous shares in rank order by the sizes in force
when it starts, so the shares of all ranks cover every sample of the epoch exactly once,
however the sizes change between batches.
"""

from typing import Callable, Iterator, List, Sequence, Tuple

import numpy as np

from .batch_sizes import balanced_sizes

__all__ = ["epoch_order", "partial_batch_sizes", "batch_share", "epoch_shares"]


def epoch_order(length: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The order in which an epoch visits samples 0..length-1: a permutation drawn from
    `seed + epoch` (numpy's PCG64, the same on every rank and platform), or 0..length-1 in
    order without `shuffle`.

    Args:
        length: the number of samples.
        shuffle: whether to permute them.
        seed: the same on every rank.
        epoch: the epoch, so that each epoch has its own order.
    """
    if not shuffle:
        return np.arange(length, dtype=np.int64)
    return np.random.default_rng(seed + epoch).permutation(length).astype(np.int64)


def partial_batch_sizes(sizes: Sequence[int], count: int) -> List[int]:
    """The local sizes for a global batch of `count` samples, fewer than `sum(sizes)` (the
    last batch of an epoch): in proportion to `sizes`, rounded by largest remainder (ties to
    the lower rank), each rank with a positive size getting at least one sample while the
    batch has one for each of them. A rank of size 0 gets none.

    Args:
        sizes: the ranks' local sizes for a full global batch, in rank order.
        count: the samples in this batch, at most `sum(sizes)`.
    """
    total = sum(sizes)
    if not 0 < count <= total:
        raise ValueError(f"a partial global batch needs between 1 and {total} samples (the sizes {list(sizes)}), "
                         f"got {count}")
    if count == total:
        return list(sizes)
    working = [rank for rank, size in enumerate(sizes) if size > 0]
    shares = balanced_sizes([float(sizes[rank]) for rank in working], count,
                            min_batch_size=1 if count >= len(working) else 0)
    result = [0] * len(sizes)
    for rank, share in zip(working, shares):
        result[rank] = share
    return result


def batch_share(sizes: Sequence[int], start: int, length: int, rank: int) -> Tuple[int, int]:
    """This rank's share, as (start, stop) positions in an epoch's order of `length` samples,
    of the global batch that begins at position `start`: `sum(sizes)` samples, or the ones
    left, split by `partial_batch_sizes`; rank r takes its size after the shares of ranks
    0..r-1.

    Args:
        sizes: every rank's local size for a full global batch, in rank order.
        start: where the global batch begins in the epoch's order (below `length`).
        length: the samples in the epoch.
        rank: this rank's position in `sizes`.
    """
    count = min(sum(sizes), length - start)
    if count < sum(sizes):
        sizes = partial_batch_sizes(sizes, count)
    offset = start + sum(sizes[:rank])
    return offset, offset + sizes[rank]


def epoch_shares(length: int, current_sizes: Callable[[], Sequence[int]], rank: int, ranks: int,
                 drop_last: bool = False) -> Iterator[Tuple[int, int]]:
    """This rank's share of each global batch of an epoch of `length` samples, as (start,
    stop) positions in the epoch's order.

    `current_sizes()` is called when each global batch starts (so sizes changed between two
    batches apply from the next one); the batch holds `sum(sizes)` samples of the order, and
    rank r gets the `sizes[r]` after the shares of ranks 0..r-1. The last batch, when fewer
    samples are left, is split by `partial_batch_sizes`, or left out with `drop_last`.

    Args:
        length: the samples in the epoch.
        current_sizes: returns every rank's local batch size, in rank order, the same list on
            every rank at the same batch.
        rank: this rank's position in those sizes.
        ranks: how many ranks share the batches; sizes of another length raise (a balancer
            not reset after the job changed size).
        drop_last: leave out a last global batch that is not full.
    """
    start = 0
    while start < length:
        sizes = [int(size) for size in current_sizes()]
        if len(sizes) != ranks or not 0 <= rank < ranks or min(sizes) < 0 or sum(sizes) <= 0:
            raise ValueError(f"rank {rank} of {ranks} cannot take a share of a global batch with local sizes "
                             f"{sizes}: needs sizes of 0 or more, one per rank, with a positive total (after "
                             "the ranks changed, reset the balancer)")
        count = min(sum(sizes), length - start)
        if count < sum(sizes) and drop_last:
            return
        yield batch_share(sizes, start, length, rank)
        start += count
