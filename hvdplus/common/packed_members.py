"""The members of a flat buffer that holds several arrays end to end."""

import math

__all__ = ["members_of"]


def members_of(packed, shapes):
    """Views of flat `packed` (slices, for arrays that have no views) shaped as `shapes`, end
    to end from its start."""
    members, start = [], 0
    for shape in shapes:
        count = math.prod(shape)
        members.append(packed[start:start + count].reshape(shape))
        start += count
    return members
