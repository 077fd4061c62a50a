"""`hvdplus.torch.BalancedSampler`: each rank's current share of every global batch, as a
LoadBalancer sizes it, for a DataLoader's `batch_sampler`.

    balancer = hvd.LoadBalancer(global_batch_size=256)
    sampler = hvd.BalancedSampler(dataset, balancer)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:          # len(x) == the balancer's local size at this batch
            ...
            balancer.rebalance()     # applies from the next batch
"""

from typing import Iterator, List

import torch

from ..common.batch_shares import epoch_order, epoch_shares

__all__ = ["BalancedSampler"]


class BalancedSampler(torch.utils.data.Sampler):
    """Yields, for each global batch of the epoch, the list of this rank's sample indices
    in it: the share `balancer.sizes()` gives this rank at the moment the batch is drawn.

    Every rank walks the same permutation (from `seed + epoch`) a global batch at a time and
    takes its contiguous share of each, so the ranks' batches of an epoch cover every sample
    exactly once, whatever sizes the balancer chooses between batches. The last global batch,
    when fewer samples are left, is split in proportion to the sizes (every rank with a
    positive size gets a sample while there is one for each), or dropped with `drop_last`.
    Every rank yields the same number of batches, so the ranks' steps stay paired.

    The sizes are read when each batch is drawn, so a `rebalance()` between two steps applies
    from the next batch. A DataLoader with `num_workers > 0` draws batches ahead
    (`prefetch_factor` per worker): those batches keep the sizes of when they were drawn, and
    coverage holds all the same.

    Args:
        dataset: a dataset with a length, or the length itself (an int).
        balancer: the `LoadBalancer` (one shared by the ranks that split the batches; this
            rank's position is its process set's rank).
        shuffle: visit the samples in an order drawn from `seed` and the epoch; otherwise in
            index order.
        seed: the same on every rank.
        drop_last: leave out the epoch's last global batch when it is not full.
    """

    def __init__(self, dataset, balancer, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        self.length = dataset if isinstance(dataset, int) else len(dataset)
        if self.length < 0:
            raise ValueError(f"BalancedSampler: the dataset's length must be 0 or more, got {self.length}")
        self.balancer = balancer
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch`'s order from the next iteration (call it on every rank)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[List[int]]:
        order = epoch_order(self.length, self.shuffle, self.seed, self.epoch)
        process_set = self.balancer.process_set
        for start, stop in epoch_shares(self.length, self.balancer.sizes, process_set.rank(), process_set.size(),
                                        self.drop_last):
            yield order[start:stop].tolist()

    def __len__(self) -> int:
        """The global batches of an epoch, with the balancer's global batch size."""
        full, rest = divmod(self.length, self.balancer.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)
