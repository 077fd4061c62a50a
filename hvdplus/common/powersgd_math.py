"""PowerSGD's arithmetic (Vogels et al., 2019), framework-free (numpy): which gradients it
compresses, their shape as a matrix, the seeded start of Q, and the orthogonalization of P."""

import zlib

import numpy as np

__all__ = ["check_rank", "matrix_shape", "orthogonalize", "starting_q"]


def check_rank(rank) -> int:
    """`rank` as an int of 1 or more, else ValueError."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"Compression.powersgd(rank=...): rank must be an integer of 1 or more, got {rank!r}")
    return int(rank)


def matrix_shape(shape, rank: int, min_compression_rate: float):
    """(n, m) that a gradient of `shape` is viewed as (its first dimension by the rest), or
    None where it goes uncompressed: a vector or scalar, or a matrix whose factors would not
    be `min_compression_rate` times smaller, n m < rate (n + m) r, as DDP's PowerSGD hook."""
    if len(shape) < 2:
        return None
    n = int(shape[0])
    m = int(np.prod(shape[1:]))
    if n * m < min_compression_rate * (n + m) * min(rank, n, m):
        return None
    return n, m


def starting_q(name: str, m: int, rank: int, dtype) -> np.ndarray:
    """The first Q of the tensor called `name`: orthonormal columns from a generator seeded by
    the name, so every rank starts from the same Q without a collective."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return orthogonalize(rng.standard_normal((m, rank))).astype(dtype)


def orthogonalize(matrix: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning `matrix`'s (Householder QR, which stays orthonormal where
    the columns are dependent, unlike Gram-Schmidt); every rank gets the same from the same."""
    q, _ = np.linalg.qr(matrix.astype(np.float64))
    return q
