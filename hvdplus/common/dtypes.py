"""Which element types hvdplus moves and reduces, and in what type it reduces them.

float16 and bfloat16 are reduced in float32 and rounded once at the end: summing many
half-precision gradients in their own type loses most of their low bits. bfloat16 arrays
come from `ml_dtypes` (which TensorFlow, JAX and hvdplus' torch extra install).
bool supports Min (logical and), Max (logical or) and Product (and); it travels as uint8.
"""

import numpy as np

__all__ = [
    "SUPPORTED_DTYPE_NAMES",
    "check_supported",
    "is_integer",
    "is_half",
    "accumulation_dtype",
]

SUPPORTED_DTYPE_NAMES = (
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64", "uint8", "bool",
)
_HALF_NAMES = ("float16", "bfloat16")


def check_supported(dtype: np.dtype, what: str) -> None:
    """Raise TypeError naming `what` (the tensor) when hvdplus cannot carry `dtype`."""
    if dtype.name not in SUPPORTED_DTYPE_NAMES:
        raise TypeError(
            f"{what} has unsupported dtype {dtype.name}; supported dtypes are "
            f"{', '.join(SUPPORTED_DTYPE_NAMES)}"
        )


def is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def is_half(dtype: np.dtype) -> bool:
    return dtype.name in _HALF_NAMES


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype in which values of `dtype` are reduced."""
    if is_half(dtype):
        return np.dtype(np.float32)
    if dtype == np.bool_:
        return np.dtype(np.uint8)
    return dtype
