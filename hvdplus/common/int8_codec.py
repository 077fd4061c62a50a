"""Int8 quantization with scales per chunk, framework-free (numpy): the arithmetic behind
Compression.int8.

Each chunk of CHUNK consecutive elements has one scale, max|x| / 127 over every rank's chunk
(the ranks agree on it with one MAX all-reduce of the chunks' maxima), so every rank's int8
values share a unit and their integer sum is exact. Rounding is to nearest, or stochastic
(floor(x/s + u), u uniform in [0, 1)), which is unbiased: E[q s] = x.
"""

import numpy as np

__all__ = ["CHUNK", "LEVELS", "chunk_absmax", "chunk_scales", "quantize", "dequantize", "summing_dtype"]

# One scale per 1024 values, agreed on as float64 (exact for every float dtype): 0.8 % more
# bytes than the int8 payload, and a chunk of a gradient rarely spans very different magnitudes.
CHUNK = 1024
LEVELS = 127  # int8 values in [-127, 127]: symmetric, so -x quantizes to -q


def _chunked(flat: np.ndarray) -> np.ndarray:
    """`flat` padded with zeros to whole chunks, as (chunks, CHUNK)."""
    chunks = -(-flat.size // CHUNK)
    padded = np.zeros(chunks * CHUNK, dtype=flat.dtype)
    padded[:flat.size] = flat
    return padded.reshape(chunks, CHUNK)


def chunk_absmax(flat: np.ndarray) -> np.ndarray:
    """max|x| of each chunk of `flat`, in float64 (so every float dtype agrees in one MAX)."""
    return np.abs(_chunked(flat)).max(axis=1).astype(np.float64)


def chunk_scales(absmax: np.ndarray) -> np.ndarray:
    """Each chunk's unit from its agreed max|x|; an all-zero chunk gets 1 (its values are 0)."""
    return np.where(absmax > 0, absmax / LEVELS, 1.0)


def quantize(flat: np.ndarray, scales: np.ndarray, rng=None) -> np.ndarray:
    """`flat` in units of its chunk's scale, as int8; stochastic rounding where `rng` (a numpy
    Generator) is given, else to nearest. |x| <= the agreed max keeps every value in range."""
    units = _chunked(flat).astype(np.float64) / scales[:, None]
    if rng is None:
        rounded = np.rint(units)
    else:
        rounded = np.floor(units + rng.random(units.shape))
    return np.clip(rounded, -LEVELS, LEVELS).astype(np.int8).reshape(-1)[:flat.size]


def dequantize(integers: np.ndarray, scales: np.ndarray, size: int, factor: float = 1.0) -> np.ndarray:
    """Integers (one rank's, or the ranks' exact sum) times their chunk's scale and `factor`,
    in float64: a float32 average of values near float32's largest never passes through an
    overflowing float32 sum."""
    chunks = np.zeros(scales.size * CHUNK, dtype=np.float64)
    chunks[:size] = integers
    return (chunks.reshape(scales.size, CHUNK) * (scales[:, None] * factor)).reshape(-1)[:size]


def summing_dtype(ranks: int):
    """The narrowest integer dtype whose all-reduced sum of `ranks` int8 values cannot overflow."""
    return np.int16 if ranks * LEVELS <= np.iinfo(np.int16).max else np.int32
