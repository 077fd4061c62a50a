"""Which element types hvdplus moves and reduces, and in what type it reduces them.

float16 and bfloat16 are reduced in float32 and rounded once at the end: summing many
half-precision gradients in their own type loses most of their low bits. bfloat16 arrays
come from `ml_dtypes` (which TensorFlow, JAX and hvdplus' torch extra install).
bool supports Min (logical and), Max (logical or) and Product (and); it travels as uint8.
"""

import numpy as np

__all__ = [
    "SUPPORTED_DTYPE_NAMES",
    "dtype_name",
    "check_supported",
    "is_integer",
    "is_half",
    "accumulation_dtype",
]

SUPPORTED_DTYPE_NAMES = (
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
)
_HALF_NAMES = ("float16", "bfloat16")


_NAMES = {}


def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, memoized: numpy computes that property anew on every access, and the
    engine asks for it on every operation."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def check_supported(dtype: np.dtype, what: str) -> None:
    """Raise TypeError naming `what` (the tensor) when hvdplus cannot carry `dtype`."""
    if dtype_name(dtype) not in SUPPORTED_DTYPE_NAMES:
        raise TypeError(
            f"{what} has unsupported dtype {dtype.name}; supported dtypes are "
            f"{', '.join(SUPPORTED_DTYPE_NAMES)}"
        )


def is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def is_half(dtype: np.dtype) -> bool:
    return dtype.name in _HALF_NAMES


_ACCUMULATION = {}


def accumulation_dtype(dtype) -> np.dtype:
    """The dtype in which values of `dtype` (a dtype or its name) are reduced.

    Takes names so that a rank holding no such array (one that has joined) needs no
    bfloat16 import to reduce zeros in its place. Memoized: it is on every call's path."""
    found = _ACCUMULATION.get(dtype)
    if found is None:
        name = dtype if isinstance(dtype, str) else dtype_name(dtype)
        if name in _HALF_NAMES:
            found = np.dtype(np.float32)
        elif name == "bool":
            found = np.dtype(np.uint8)
        else:
            found = np.dtype(name)
        _ACCUMULATION[dtype] = found
    return found
