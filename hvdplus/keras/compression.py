"""Compression.none, .fp16 and .bf16 for Keras backend tensors (see hvdplus.common.compression):
one cast through keras.ops, so the same compressor serves TensorFlow tensors inside
tf.function, torch tensors and JAX tracers."""

import keras

from ..common.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


def _is_floating(tensor) -> bool:
    return "float" in keras.backend.standardize_dtype(tensor.dtype)


FP16Compressor, BF16Compressor, Compression = compression_for(
    cast=keras.ops.cast, is_floating=_is_floating, float16="float16", bfloat16="bfloat16",
)
