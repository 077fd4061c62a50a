"""Ranges of a concatenation of arrays that is never built: which parts of which arrays
cover a range of positions. The shared window and the single-copy reads both reduce a
batch of arrays as if it were one buffer, slice by slice."""

import bisect

__all__ = ["pieces_of"]


def pieces_of(arrays, ends, lo, hi):
    """(index, start, stop, position) for the parts of arrays that cover positions lo:hi of
    their concatenation; `ends[i]` is where array i ends in it."""
    index = bisect.bisect_right(ends, lo)
    while lo < hi and index < len(arrays):
        begin = ends[index] - arrays[index].size
        stop = min(hi, ends[index])
        if stop > lo:
            yield index, lo - begin, stop - begin, lo
        lo = stop
        index += 1
