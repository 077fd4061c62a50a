"""Where a numpy array's data lies: its address, and whether two arrays start at the same one."""

import ctypes

import numpy as np

__all__ = ["address_of", "same_memory"]

_BYTE = ctypes.c_char


def address_of(array: np.ndarray) -> int:
    """Where `array`'s data starts in this process's memory.

    Through ctypes' view of a writeable buffer, which is several times cheaper than
    `__array_interface__` (that builds a dict), since a group of gradients asks this of
    every member, output and piece."""
    if array.flags.writeable:
        try:
            return ctypes.addressof(_BYTE.from_buffer(array))
        except (TypeError, ValueError, BufferError):  # empty, or not one contiguous buffer
            pass
    return array.__array_interface__["data"][0]


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays start at the same address (cheaper than np.shares_memory)."""
    return address_of(a) == address_of(b)
