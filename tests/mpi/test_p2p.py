"""Point-to-point messages (hvdplus.core.p2p and its torch and tensorflow forms): every
dtype between ranks 0 and 1 and around a ring of all ranks, order, async handles, the
mismatch errors on both ranks, argument and process-set errors, and gradients flowing back
through torch messages. Needs two ranks; run at 2 and 3 (tests/test_mpi_suites.py)."""

import os

import numpy as np
import pytest

import hvdplus as hvd
from hvdplus.common.dtypes import SUPPORTED_DTYPE_NAMES
from hvdplus.core.runtime import current

from testkit import late_peer
from testkit.rank_data import rank_values

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.skipif(hvd.size() < 2, reason="point-to-point messages need two ranks")

SHAPES = [(3, 4), (), (0, 2)]


@pytest.fixture(autouse=True)
def ranks_in_step():
    """Each test starts together on every rank, whatever the last one left behind."""
    hvd.barrier()
    yield


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def values(name, shape, rank, seed):
    return rank_values(numpy_dtype(name), shape, rank, seed)


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual.reshape(-1).view(np.uint8), expected.reshape(-1).view(np.uint8))


# -- numpy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SUPPORTED_DTYPE_NAMES)
def test_every_dtype_and_shape_between_ranks_0_and_1(name, rank):
    for seed, shape in enumerate(SHAPES):
        sent = values(name, shape, 0, seed)
        if rank == 0:
            assert hvd.send(sent, 1, tag=seed) is None
            hvd.send(sent, 1, tag=seed)
        elif rank == 1:
            assert_same(hvd.recv(shape, 0, tag=seed, dtype=name), sent)
            into = np.zeros(shape, dtype=numpy_dtype(name))
            assert hvd.recv(into, 0, tag=seed) is into
            assert_same(into, sent)


@pytest.mark.parametrize("name", SUPPORTED_DTYPE_NAMES)
def test_every_dtype_around_a_ring_of_all_ranks(name, rank, size):
    # Everyone sends before receiving: blocking sends would wait on each other, the async forms do not.
    following, previous = (rank + 1) % size, (rank - 1) % size
    sending = hvd.send_async(values(name, (5,), rank, 11), following, tag=3)
    receiving = hvd.recv_async((5,), previous, tag=3, dtype=numpy_dtype(name))
    assert_same(hvd.synchronize(receiving), values(name, (5,), previous, 11))
    assert hvd.synchronize(sending) is None


def test_messages_with_one_tag_arrive_in_order_whatever_order_they_are_waited_for(rank):
    if rank == 0:
        handles = [hvd.send_async(np.full(4, float(i)), 1, tag=9) for i in range(6)]
        for handle in reversed(handles):
            handle.wait()
    elif rank == 1:
        handles = [hvd.recv_async(4, 0, tag=9, dtype=np.float64) for _ in range(6)]
        received = [handle.wait() for handle in reversed(handles)][::-1]
        for i, array in enumerate(received):
            np.testing.assert_array_equal(array, np.full(4, float(i)))


def test_tags_are_independent(rank):
    if rank == 0:
        later = hvd.send_async(np.array([2.0]), 1, tag=2)
        hvd.send(np.array([1.0]), 1, tag=1)
        later.wait()
    elif rank == 1:
        assert hvd.recv(1, 0, tag=1, dtype=np.float64)[0] == 1.0
        assert hvd.recv(1, 0, tag=2, dtype=np.float64)[0] == 2.0


def test_waiting_for_one_message_moves_the_others_on(rank):
    # Rank 1's receive of tag 1 only progresses while it waits for tag 2, which rank 0
    # sends once tag 1 is acknowledged.
    if rank == 0:
        hvd.send(np.array([1.0]), 1, tag=1)
        hvd.send(np.array([2.0]), 1, tag=2)
    elif rank == 1:
        first = hvd.recv_async(1, 0, tag=1, dtype=np.float64)
        assert hvd.recv(1, 0, tag=2, dtype=np.float64)[0] == 2.0
        assert first.done() and first.wait()[0] == 1.0


def test_a_rank_receiving_from_a_late_sender_leaves_the_core_to_others(rank, size):
    # The receiver looks at its message with a backoff (testkit.late_peer holds the limit).
    if size == 1:
        pytest.skip("needs a peer")
    sent = np.arange(1024, dtype=np.float32)
    if rank == size - 1:
        late_peer.wait_for_late_peer(lambda: [hvd.send(sent, peer, tag=5) for peer in range(size - 1)],
                                     current().algorithms.comm.Barrier, late=True)
    else:
        into = np.empty_like(sent)
        waited, cpu = late_peer.wait_for_late_peer(lambda: hvd.recv(into, size - 1, tag=5),
                                                   current().algorithms.comm.Barrier, late=False)
        assert_same(into, sent)
        late_peer.check_share(waited, cpu, f"hvd.recv from rank {size - 1}")


def test_poll_drives_messages_to_completion(rank):
    if rank == 0:
        handle = hvd.send_async(np.arange(3, dtype=np.int32), 1, tag=4)
        while not hvd.poll(handle):
            pass
        assert handle.done() and hvd.synchronize(handle) is None
    elif rank == 1:
        handle = hvd.recv_async(3, 0, tag=4, dtype="int32")
        while not handle.poll():
            pass
        np.testing.assert_array_equal(handle.wait(), np.arange(3, dtype=np.int32))


@pytest.mark.parametrize("sent_dtype, sent_shape, expected_dtype, expected_shape", [
    ("float32", (3,), "float32", (4,)),
    ("float32", (2, 3), "float32", (3, 2)),
    ("float32", (3,), "float64", (3,)),
    ("int16", (2,), "float32", (1,)),
], ids=["size", "shape", "dtype", "dtype-same-bytes"])
def test_mismatches_raise_on_both_ranks_and_the_pair_goes_on(sent_dtype, sent_shape, expected_dtype,
                                                             expected_shape, rank):
    message = (rf"point-to-point message from rank 0 to rank 1 with tag 5 does not match: rank 0 sent "
               rf"{sent_dtype} of shape {sent_shape}, rank 1 expected {expected_dtype} of shape {expected_shape}")
    if rank == 0:
        with pytest.raises(ValueError) as info:
            hvd.send(np.zeros(sent_shape, dtype=sent_dtype), 1, tag=5)
        hvd.send(np.ones(2), 1, tag=5)
    elif rank == 1:
        with pytest.raises(ValueError) as info:
            hvd.recv(expected_shape, 0, tag=5, dtype=expected_dtype)
        np.testing.assert_array_equal(hvd.recv(2, 0, tag=5, dtype=np.float64), np.ones(2))
    if rank < 2:
        assert str(info.value) == message.replace("\\", "")


def test_argument_errors(rank, size):
    with pytest.raises(ValueError, match=f"dst {rank} is this rank"):
        hvd.send(np.zeros(1), rank)
    with pytest.raises(ValueError, match=f"src {rank} is this rank"):
        hvd.recv(1, rank)
    other = (rank + 1) % size
    with pytest.raises(ValueError, match=f"dst {size} is out of range for a job of {size} ranks"):
        hvd.send(np.zeros(1), size)
    with pytest.raises(ValueError, match=r"tag -1 is out of range \[0, "):
        hvd.send(np.zeros(1), other, tag=-1)
    with pytest.raises(TypeError, match="tag must be an int"):
        hvd.recv(1, other, tag=1.5)
    with pytest.raises(TypeError, match="unsupported dtype complex64"):
        hvd.send(np.zeros(1, dtype=np.complex64), other)
    with pytest.raises(TypeError, match="expected a numpy array or a shape"):
        hvd.recv("3", other)
    with pytest.raises(ValueError, match="C-contiguous and writeable"):
        hvd.recv(np.zeros((4, 4))[:, 0], other)


def test_process_set_membership(rank, size):
    members = [0, 1] if size > 2 else [1]  # a set of every rank would be the global one
    pair = hvd.add_process_set(members)
    try:
        if rank not in members:
            with pytest.raises(ValueError, match=f"does not include rank {rank}"):
                hvd.send(np.zeros(1), members[0], process_set=pair)
        elif len(members) == 1:
            with pytest.raises(ValueError, match=r"dst rank 0 is not in the process set \[1\]"):
                hvd.send(np.zeros(1), 0, process_set=pair)
        else:
            with pytest.raises(ValueError, match=r"dst rank 2 is not in the process set \[0, 1\]"):
                hvd.send(np.zeros(1), 2, process_set=pair)
            if rank == 0:
                hvd.send(np.arange(2.0), 1, tag=6, process_set=pair)
            else:
                np.testing.assert_array_equal(hvd.recv(2, 0, tag=6, dtype=np.float64, process_set=pair), [0.0, 1.0])
        if rank in (0, 1):  # the global set is always fine
            other = 1 - rank
            received = hvd.recv_async(1, other, tag=7, process_set=hvd.global_process_set)
            hvd.send(np.ones(1, dtype=np.float32), other, tag=7, process_set=hvd.global_process_set)
            assert received.wait()[0] == 1.0
    finally:
        hvd.remove_process_set(pair)


# -- torch ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_hvd():
    if torch is None:
        pytest.skip("torch is not installed")
    import hvdplus.torch

    return hvdplus.torch


TORCH_DTYPES = [] if torch is None else [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool,
]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_every_dtype_between_ranks_0_and_1(torch_hvd, dtype, rank):
    name = str(dtype).replace("torch.", "")
    sent = torch.from_numpy(values(name if name != "bfloat16" else "float32", (2, 3), 0, 21)).to(dtype)
    if rank == 0:
        zero = torch_hvd.send(sent, 1, tag=2)
        assert zero.shape == () and zero.item() == 0
        torch_hvd.synchronize(torch_hvd.send_async(sent, 1, tag=2))
    elif rank == 1:
        received = torch_hvd.recv((2, 3), 0, tag=2, dtype=dtype)
        assert received.dtype == dtype and torch.equal(received, sent)
        into = torch.zeros(2, 3, dtype=dtype)
        assert torch_hvd.synchronize(torch_hvd.recv_async(into, 0, tag=2)) is into
        assert torch.equal(into, sent)


def test_torch_mismatch_raises_on_both_ranks(torch_hvd, rank):
    if rank == 0:
        with pytest.raises(ValueError, match=r"rank 0 sent int64 of shape \(3,\), rank 1 expected float32"):
            torch_hvd.send(torch.arange(3), 1, tag=8)
    elif rank == 1:
        with pytest.raises(ValueError, match=r"rank 0 sent int64 of shape \(3,\), rank 1 expected float32"):
            torch_hvd.recv(torch.zeros(3), 0, tag=8)


def stage0(x):
    return torch.sin(x) * torch.arange(1.0, 5.0, dtype=x.dtype)


def stage1(r):
    return (r ** 3).sum() + r.prod()


@pytest.mark.parametrize("backward", ["sum", "list"])
def test_torch_gradient_flows_back_to_the_sender(torch_hvd, rank, backward):
    x0 = torch.linspace(-1.0, 1.0, 4, dtype=torch.float64)
    if rank == 0:
        x = x0.clone().requires_grad_()
        own = (x ** 2).sum()
        sent = torch_hvd.send(stage0(x), 1, tag=3)
        assert sent.requires_grad and sent.item() == 0
        if backward == "sum":
            (own + sent).backward()
        else:
            torch.autograd.backward([own, sent])
        reference = x0.clone().requires_grad_()
        (want,) = torch.autograd.grad((reference ** 2).sum() + stage1(stage0(reference)), reference)
        torch.testing.assert_close(x.grad, want, rtol=1e-12, atol=1e-12)
    elif rank == 1:
        received = torch_hvd.recv((4,), 0, tag=3, dtype=torch.float64, requires_grad=True)
        assert received.requires_grad
        torch.testing.assert_close(received.detach(), stage0(x0))
        stage1(received).backward()


def test_torch_gradient_through_a_pipeline_of_all_ranks(torch_hvd, rank, size):
    # rank 0 -> 1 -> ... -> last: each stage scales and squashes; the last takes the loss.
    def stage(r, h):
        return torch.tanh(h * (r + 1.5))

    x0 = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    if rank == 0:
        x = x0.clone().requires_grad_()
        torch_hvd.send(stage(0, x), 1, tag=4).backward()
        reference = x0.clone().requires_grad_()
        h = reference
        for r in range(size):
            h = stage(r, h)
        (want,) = torch.autograd.grad((h ** 2).sum(), reference)
        torch.testing.assert_close(x.grad, want, rtol=1e-12, atol=1e-12)
    else:
        h = stage(rank, torch_hvd.recv((3,), rank - 1, tag=4, dtype=torch.float64, requires_grad=True))
        if rank == size - 1:
            (h ** 2).sum().backward()
        else:
            torch_hvd.send(h, rank + 1, tag=4).backward()


def test_torch_recv_requires_grad_needs_a_floating_dtype(torch_hvd, rank, size):
    with pytest.raises(ValueError, match="requires_grad needs a floating dtype"):
        torch_hvd.recv((2,), (rank + 1) % size, dtype=torch.int32, requires_grad=True)


# -- tensorflow ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf_hvd():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pytest.importorskip("tensorflow")
    import hvdplus.tensorflow

    return hvdplus.tensorflow


TF_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_tensorflow_every_dtype_between_ranks_0_and_1(tf_hvd, mode, rank):
    import tensorflow as tf

    def exchange(sent_by_zero):
        if rank == 0:
            for tensor in sent_by_zero:
                tf_hvd.send(tensor, 1, tag=1)
            return [tf.zeros(())]
        received = []
        for tensor in sent_by_zero:
            received.append(tf_hvd.recv(tensor.shape.as_list(), 0, tag=1, dtype=tensor.dtype))
            received.append(tf_hvd.recv(tf.zeros_like(tensor), 0, tag=1))  # a template
        return received

    sent = [tf.constant(values(name, (2, 2), 0, 31), dtype=tf.as_dtype(name)) for name in TF_DTYPES]
    if rank == 0:
        doubled = [t for t in sent for _ in range(2)]
        (tf.function(exchange) if mode == "graph" else exchange)(doubled)
    elif rank == 1:
        received = (tf.function(exchange) if mode == "graph" else exchange)(sent)
        for i, tensor in enumerate(sent):
            for got in received[2 * i:2 * i + 2]:
                assert got.dtype == tensor.dtype and got.shape == tensor.shape
                assert_same(got.numpy(), tensor.numpy())


def test_tensorflow_mismatch_raises_on_both_ranks(tf_hvd, rank):
    import tensorflow as tf

    pattern = r"rank 0 sent float32 of shape \(2,\), rank 1 expected float32 of shape \(3,\)"
    if rank == 0:
        with pytest.raises(ValueError, match=pattern):
            tf_hvd.send(tf.zeros(2), 1, tag=2)
    elif rank == 1:
        with pytest.raises(ValueError, match=pattern):
            tf_hvd.recv([3], 0, tag=2)
