"""Compression.none, .fp16 and .bf16 for TensorFlow tensors (see hvdplus.common.compression)."""

import tensorflow as tf

from ..common.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]

FP16Compressor, BF16Compressor, Compression = compression_for(
    cast=tf.cast,
    is_floating=lambda tensor: tensor.dtype.is_floating,
    float16=tf.float16,
    bfloat16=tf.bfloat16,
)
