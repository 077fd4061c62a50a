"""Torch's side of the compressors with state (hvdplus.core.compressed_reduction): their
state as tensors in a dict (the optimizer's state of a parameter), and a tensor's reduction
on a float32 or float64 CPU copy where its own memory is not that."""

import numpy as np
import torch

from ..core.compressed_reduction import ArrayState

__all__ = ["TensorState", "tensor_stages"]


class TensorState(ArrayState):
    """An ArrayState whose arrays are torch tensors in `store` (e.g. optimizer.state[p]), so
    state_dict(), broadcast_optimizer_state and elastic commits carry them. A tensor that
    load_state_dict moved to another device or dtype is worked on as a CPU copy, written
    back by `flush()`."""

    def __init__(self, store):
        super().__init__(store)
        self._copies = []

    def array(self, key, shape, dtype, initial=None) -> np.ndarray:
        tensor = self.store.get(key)
        wanted = torch.from_numpy(np.zeros((), dtype)).dtype
        if tensor is None or tuple(tensor.shape) != tuple(shape):
            value = np.zeros(shape, dtype) if initial is None else np.asarray(initial(), dtype=dtype)
            tensor = torch.from_numpy(np.ascontiguousarray(value))
            self.store[key] = tensor
            return tensor.numpy()
        if tensor.device.type == "cpu" and tensor.dtype == wanted and tensor.is_contiguous():
            return tensor.detach().numpy()
        working = tensor.detach().to("cpu", wanted).contiguous()
        self._copies.append((tensor, working))
        return working.numpy()

    def flush(self) -> None:
        for tensor, working in self._copies:
            with torch.no_grad():
                tensor.copy_(working)
        self._copies = []


def _working_dtype(tensor):
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def tensor_stages(compression, tensor, name, store, factor, process_set):
    """The reduction of `tensor` (written in place) with `compression`, as stages; its state in
    `store` (a dict, or None for no error feedback)."""
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{compression!r}: '{name}' is {tensor.dtype}; it compresses floating-point tensors only")
    in_place = tensor.device.type == "cpu" and tensor.dtype == _working_dtype(tensor) and tensor.is_contiguous()
    working = tensor.detach() if in_place else tensor.detach().to("cpu", _working_dtype(tensor)).contiguous()
    state = None if store is None else TensorState(store)
    yield from compression.stages(working.numpy(), name, state, factor, process_set)
    if state is not None:
        state.flush()
    if not in_place:
        with torch.no_grad():
            tensor.copy_(working)
