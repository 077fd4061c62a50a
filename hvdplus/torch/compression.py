"""hvd.Compression for torch tensors: .none, .fp16 and .bf16 cast each tensor for the wire
(hvdplus.common.compression); .int8, .topk(ratio) and .powersgd(rank=...) reduce it with
collectives of their own and keep error feedback in the optimizer's state
(hvdplus.core.compressed_reduction, hvdplus.torch.lossy_reduction)."""

import torch

from ..common.compression import Compressor, NoneCompressor, compression_for
from ..core.int8_compression import Int8Compression
from ..core.powersgd_compression import PowerSGDCompression
from ..core.topk_compression import TopKCompression

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]

FP16Compressor, BF16Compressor, Compression = compression_for(
    cast=lambda tensor, dtype: tensor.to(dtype),
    is_floating=lambda tensor: tensor.dtype.is_floating_point,
    float16=torch.float16,
    bfloat16=torch.bfloat16,
)
Compression.int8 = Int8Compression()
Compression.topk = TopKCompression
Compression.powersgd = PowerSGDCompression
