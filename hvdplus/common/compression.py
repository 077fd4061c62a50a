"""Gradient compression for the wire, framework-free: Compression.none, .fp16, .bf16.

A compressor turns a tensor into the one that is all-reduced and back; fp16 halves the
bytes moved at the cost of precision (hvdplus still reduces half types in float32). Each
adapter builds its `Compression` from `compression_for` with its own cast.
"""

import types

__all__ = ["Compressor", "NoneCompressor", "compression_for"]


class Compressor:
    """compress(tensor) -> (tensor to send, context); decompress(tensor, context) -> tensor."""

    @classmethod
    def compress(cls, tensor):
        raise NotImplementedError

    @classmethod
    def decompress(cls, tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @classmethod
    def compress(cls, tensor):
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Floating-point tensors travel as `wire_dtype` and come back in their own dtype."""

    wire_dtype = None

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @staticmethod
    def is_floating(tensor) -> bool:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.is_floating(tensor) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)


def compression_for(cast, is_floating, float16, bfloat16):
    """A framework's compressors and `Compression` namespace, from its cast and dtypes.

    Returns (FP16Compressor, BF16Compressor, Compression)."""
    hooks = {"cast": staticmethod(cast), "is_floating": staticmethod(is_floating)}
    fp16 = type("FP16Compressor", (_CastCompressor,), dict(hooks, wire_dtype=float16))
    bf16 = type("BF16Compressor", (_CastCompressor,), dict(hooks, wire_dtype=bfloat16))
    return fp16, bf16, types.SimpleNamespace(none=NoneCompressor, fp16=fp16, bf16=bf16)
