"""Compression.none, .fp16 and .bf16 for torch tensors (see hvdplus.common.compression)."""

import torch

from ..common.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]

FP16Compressor, BF16Compressor, Compression = compression_for(
    cast=lambda tensor, dtype: tensor.to(dtype),
    is_floating=lambda tensor: tensor.dtype.is_floating_point,
    float16=torch.float16,
    bfloat16=torch.bfloat16,
)
