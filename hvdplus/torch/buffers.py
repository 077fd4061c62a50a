"""Torch tensors as numpy buffers for the communication layer, and results back as tensors.

CPU tensors share memory with the arrays handed to the core (`Tensor.numpy()`), so nothing
is copied on the way in. bfloat16, which numpy lacks, travels as `ml_dtypes.bfloat16`
over the same memory. CUDA tensors are staged through host memory: copied to the CPU,
reduced there, and copied back.
"""

import numpy as np
import torch

from ..common.dtypes import SUPPORTED_DTYPE_NAMES

__all__ = ["SUPPORTED", "numpy_view", "numpy_views", "as_in_place_array", "copy_back", "to_tensor", "check_tensor"]

SUPPORTED = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
)


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("bfloat16 tensors need the ml_dtypes package: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def check_tensor(tensor, what: str, in_place: bool = False) -> None:
    """ValueError or TypeError, naming `what`, for a tensor hvdplus cannot take as it is."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED)
        raise ValueError(f"{what}: unsupported dtype {tensor.dtype}; supported: {names}")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported here; use .to_dense()")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: tensor is not contiguous; pass tensor.contiguous()")
    if in_place and tensor.requires_grad and tensor.is_leaf:
        raise ValueError(
            f"{what}: an in-place collective would overwrite a leaf tensor that requires grad; "
            "use the out-of-place version, or tensor.data"
        )


def numpy_view(tensor) -> np.ndarray:
    """A numpy array over the tensor's memory (a host copy for CUDA tensors)."""
    host = tensor.detach() if tensor.requires_grad else tensor
    # is_cpu rather than device.type, which builds a torch.device: an optimizer step asks
    # this of every gradient.
    if not host.is_cpu:
        host = host.cpu()
    if host.dtype == torch.bfloat16:
        return host.view(torch.int16).numpy().view(_bfloat16())
    return host.numpy()


# What Tensor.numpy() can return for a supported dtype (bfloat16 it refuses).
_NUMPY_DTYPES = frozenset(np.dtype(name) for name in SUPPORTED_DTYPE_NAMES if name != "bfloat16")


def numpy_views(tensors, what: str, in_place: bool = False) -> list:
    """numpy_view of each of `tensors`, after check_tensor of each. Plain contiguous CPU
    tensors that need no gradient (a training step's gradients) take one conversion each:
    asking each tensor for each property that check_tensor and numpy_view look at costs more
    than the conversion. Anything else goes through both, one tensor at a time, so that the
    errors stay theirs."""
    try:
        arrays = [tensor.numpy() for tensor in tensors]  # refuses grad, sparse, CUDA, bfloat16
    except (AttributeError, TypeError, RuntimeError):
        arrays = None
    if arrays is None or not all(a.dtype in _NUMPY_DTYPES and a.flags.c_contiguous for a in arrays):
        for tensor in tensors:
            check_tensor(tensor, what, in_place)
        arrays = [numpy_view(tensor) for tensor in tensors]
    return arrays


def as_in_place_array(tensor):
    """(array to reduce in place, function that finishes the tensor afterwards).

    For a CPU tensor the array is its memory; a CUDA tensor gets a host copy that is
    copied back when the operation is done."""
    array = numpy_view(tensor)
    if tensor.is_cpu:
        return array, lambda: tensor
    return array, lambda: copy_back(array, tensor)


def copy_back(array: np.ndarray, tensor):
    """Write a host copy's result back into its (CUDA) `tensor`; returns `tensor`."""
    tensor.copy_(to_tensor(array, tensor))
    return tensor


def to_tensor(array: np.ndarray, like) -> torch.Tensor:
    """A tensor over `array`'s memory, on `like`'s device, with `like`'s dtype family."""
    if array.dtype.name == "bfloat16":
        result = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        result = torch.from_numpy(array)
    if like is not None and not like.is_cpu:
        result = result.to(like.device)
    return result
