"""The `staleness=` setting of the DistributedOptimizers (bounded staleness): 0 applies each step's
averaged gradients in that step, 1 one step later. torch's and Keras' optimizers check it alike."""

__all__ = ["staleness_setting"]


def staleness_setting(staleness) -> int:
    """`staleness` as an int, 0 or 1; ValueError for anything else.

    Args:
        staleness: what the user gave DistributedOptimizer(staleness=).
    """
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness not in (0, 1):
        raise ValueError(f"DistributedOptimizer: staleness must be 0 (synchronous) or 1 (apply each step's "
                         f"averaged gradients one step later), got {staleness!r}")
    return staleness
