"""Point-to-point messages on torch tensors (see hvdplus.core.p2p for the checks, order and
completion rules), differentiable across ranks.

    # rank 0                                   # rank 1
    y = stage0(x)                              r = hvd.recv(y_shape, src=0, requires_grad=True)
    sent = hvd.send(y, dst=1)                  loss = stage1(r)
    (loss0 + sent).backward()                  loss.backward()      # sends r's gradient to 0

The gradient contract:
  * `recv(..., requires_grad=True)` returns a tensor whose backward sends its gradient
    back to `src` (with the same tag, on a gradient channel that never meets forward
    messages). Received integer or bool tensors cannot require grad.
  * `send(tensor, ...)` returns a 0-dim zero tensor connected to `tensor` when it requires
    grad. Its backward receives the gradient of the sent tensor from `dst` and passes it
    into `tensor`'s graph (times the gradient reaching the 0-dim tensor, 1 in
    `(loss + sent).backward()` and `torch.autograd.backward([loss, sent])`). Adding `sent`
    changes no value.
  * Both backward passes block until the peer's matching backward runs, as the forward
    calls did: the receiver's backward returns once the sender's has the gradient. So
    every rank that received with requires_grad must run a backward through that tensor,
    and the sender must run one through `sent`, or the other waits forever. When several
    messages share a tag between the same two ranks, their backward passes must run in
    the same order on both (give each its own tag to be safe).

Tensors on CUDA are staged through host memory. `recv` with a shape returns a CPU tensor
unless `device` is given. The async forms are not differentiable: `send_async` returns a
handle whose synchronize gives None, `recv_async` one that gives the tensor.
"""

import torch

from ..core import p2p
from .buffers import SUPPORTED, numpy_view, as_in_place_array, check_tensor, to_tensor

__all__ = ["send", "recv", "send_async", "recv_async"]


def _numpy_dtype_name(dtype, what: str) -> str:
    if dtype not in SUPPORTED:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED)
        raise ValueError(f"{what}: unsupported dtype {dtype}; supported: {names}")
    return str(dtype).replace("torch.", "")


def send_async(tensor, dst, tag=0, process_set=None):
    """Start sending `tensor` to job rank `dst`; synchronize returns None once it has it."""
    check_tensor(tensor, f"send to rank {dst}")
    return p2p.send_async(numpy_view(tensor), dst, tag, process_set)


def recv_async(tensor_or_shape, src, tag=0, dtype=None, process_set=None, device=None):
    """Start receiving from job rank `src`, into `tensor_or_shape` when it is a tensor (the
    handle gives that tensor back), else into a new tensor of that shape and `dtype`
    (default torch.float32) on `device` (default the CPU)."""
    if isinstance(tensor_or_shape, torch.Tensor):
        tensor = tensor_or_shape
        check_tensor(tensor, f"recv from rank {src}", in_place=True)
        if dtype is not None and dtype != tensor.dtype:
            raise ValueError(f"recv from rank {src}: dtype {dtype} differs from the tensor's {tensor.dtype}")
        array, finish = as_in_place_array(tensor)
        return p2p.recv_async(array, src, tag, None, process_set).then(lambda _: finish())
    name = _numpy_dtype_name(torch.float32 if dtype is None else dtype, f"recv from rank {src}")
    shape = tuple(tensor_or_shape) if isinstance(tensor_or_shape, torch.Size) else tensor_or_shape
    core = p2p.recv_async(shape, src, tag, name, process_set)
    if device is None:
        return core.then(lambda array: to_tensor(array, None))
    return core.then(lambda array: to_tensor(array, None).to(device))


class _SendFunction(torch.autograd.Function):
    """Forward: send; backward: the sent tensor's gradient, received from the peer."""

    @staticmethod
    def forward(ctx, tensor, dst, tag, process_set):
        ctx.message = (dst, tag, process_set, tuple(tensor.shape), tensor.dtype, tensor.device)
        send_async(tensor, dst, tag, process_set).wait()
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        dst, tag, process_set, shape, dtype, device = ctx.message
        name = _numpy_dtype_name(dtype, f"gradient from rank {dst}")
        received = p2p.recv_async(shape, dst, tag, name, process_set, gradient=True).wait()
        return to_tensor(received, None).to(device) * grad, None, None, None


class _RecvFunction(torch.autograd.Function):
    """Forward: the received tensor (received already); backward: its gradient, sent back.
    `anchor`, an empty tensor that requires grad, puts the result in the graph."""

    @staticmethod
    def forward(ctx, anchor, received, src, tag, process_set):
        ctx.message = (src, tag, process_set)
        return received.view_as(received)

    @staticmethod
    def backward(ctx, grad):
        src, tag, process_set = ctx.message
        check_tensor(grad, f"gradient to rank {src}")
        grad = grad.contiguous()
        p2p.send_async(numpy_view(grad), src, tag, process_set, gradient=True).wait()
        return None, None, None, None, None


def send(tensor, dst, tag=0, process_set=None):
    """Send `tensor` to job rank `dst`; returns once `dst` has it (see hvdplus.core.p2p).

    Returns a 0-dim zero tensor; when `tensor` requires grad it is connected to it, and
    its backward receives the gradient from `dst` (see the module's docstring)."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _SendFunction.apply(tensor, dst, tag, process_set)
    send_async(tensor, dst, tag, process_set).wait()
    return tensor.new_zeros(())


def recv(tensor_or_shape, src, tag=0, dtype=None, process_set=None, requires_grad=False, device=None):
    """Receive from job rank `src` into the given tensor (returned) or a new tensor of the
    given shape and `dtype` (default torch.float32) on `device` (default the CPU).

    With `requires_grad` the result requires grad, and its backward sends the gradient
    back to `src` (see the module's docstring)."""
    if requires_grad:
        dtype_of = tensor_or_shape.dtype if isinstance(tensor_or_shape, torch.Tensor) else dtype or torch.float32
        if not dtype_of.is_floating_point:
            raise ValueError(f"recv from rank {src}: requires_grad needs a floating dtype, not {dtype_of}")
    received = recv_async(tensor_or_shape, src, tag, dtype, process_set, device).wait()
    if requires_grad and torch.is_grad_enabled():
        anchor = torch.empty(0, requires_grad=True)
        return _RecvFunction.apply(anchor, received, src, tag, process_set)
    return received
