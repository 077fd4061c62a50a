"""Weighted averages in the torch adapter on real ranks: `allreduce(weight=)` against numpy, and
DistributedOptimizer over uneven local batches (by `set_local_samples` or a LoadBalancer)
against one process training plain torch on the union of the batches, and BalancedSampler's
batches covering every sample once per epoch while the balancer moves the sizes."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.torch_reference import train_plainly  # noqa: E402
from testkit.weighted_reference import counts, numpy_weighted_average, values_of  # noqa: E402

STEPS = 10
FEATURES, OUTPUTS = 6, 3


@pytest.fixture(autouse=True)
def job_still_works_afterwards(size):
    yield
    np.testing.assert_array_equal(hvd.allreduce(torch.ones(3), op=hvd.Sum).numpy(), np.full(3, size))


# -- hvdplus.torch.allreduce(weight=) ------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_allreduce_equals_numpy(dtype, rank, size):
    weights = counts(size)
    expected = numpy_weighted_average([values_of(r) for r in range(size)], weights)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    tensor = torch.tensor(values_of(rank), dtype=dtype)
    result = hvd.allreduce(tensor, op=hvd.Average, weight=weights[rank], name="weighted.new")
    assert result.dtype == dtype
    np.testing.assert_allclose(result.numpy(), expected, rtol=tolerance, atol=tolerance)
    # The plain average differs wherever the counts do: the weight is really applied.
    if size > 1:
        assert not np.allclose(result.numpy(), np.mean([values_of(r) for r in range(size)], axis=0), atol=1e-3)
    # The async form, with the weight as a one-element tensor.
    handle = hvd.allreduce_async(tensor, op=hvd.Average, weight=torch.tensor(weights[rank]), name="weighted.async")
    np.testing.assert_allclose(hvd.synchronize(handle).numpy(), expected, rtol=tolerance, atol=tolerance)
    # In place.
    handle = hvd.allreduce_async_(tensor, weight=weights[rank], name="weighted.inplace")
    assert hvd.synchronize(handle) is tensor
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=tolerance, atol=tolerance)


def test_weighted_allreduce_of_several_tensors_in_one_group(rank, size):
    weights = counts(size)
    tensors = [torch.tensor(values_of(rank, shape), dtype=torch.float32) for shape in ((5,), (2, 3))]
    hvd.synchronize(hvd.grouped_allreduce_async_(tensors, weight=weights[rank], name="weighted.group"))
    for tensor, shape in zip(tensors, ((5,), (2, 3))):
        expected = numpy_weighted_average([values_of(r, shape) for r in range(size)], weights)
        np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", [int, np.int64, torch.tensor], ids=["int", "numpy", "tensor"])
def test_the_gradient_of_a_weighted_average(kind, rank, size):
    # y = sum_j(w_j x_j) / W on every rank; rank k's loss is sum(c_k * y); the gradient of the
    # summed losses with respect to x_i is (w_i / W) * sum_k(c_k). Whatever kind of number the
    # weight is (a numpy count took a path without a gradient once).
    weights = counts(size)
    x = torch.tensor(values_of(rank), dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, weight=kind(weights[rank]), name=f"weighted.grad.{kind.__name__}")
    (y * torch.tensor(values_of(50 + rank))).sum().backward()
    expected = weights[rank] / sum(weights) * sum(values_of(50 + k) for k in range(size))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_a_weight_with_another_op_raises_on_every_rank_naming_the_tensor(rank, size):
    with pytest.raises(ValueError, match=r"'weighted\.sum'.*op=Average"):
        hvd.allreduce(torch.ones(3), op=hvd.Sum, weight=1.0, name="weighted.sum")


def test_weights_that_sum_to_zero_raise_on_every_rank(rank, size):
    with pytest.raises(ValueError, match=r"'weighted\.zero'.*sum to 0.*rank 0 had 0"):
        hvd.allreduce(torch.ones(3), weight=0, name="weighted.zero")


def test_a_negative_weight_on_one_rank_raises_on_every_rank(rank, size):
    bad = size - 1
    with pytest.raises(ValueError, match=rf"'weighted\.negative'.*rank {bad} gave weight -1"):
        hvd.allreduce(torch.ones(3), weight=-1 if rank == bad else 1, name="weighted.negative")


# -- DistributedOptimizer over uneven batches ----------------------------------------------
def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, OUTPUTS))


OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def loss_fn(model, x, y):
    # The mean over this rank's own samples: what the weights make exact.
    return torch.nn.functional.mse_loss(model(x), y)


def global_batches(total, steps=STEPS):
    generator = torch.Generator().manual_seed(4321)
    return [(torch.randn(total, FEATURES, generator=generator), torch.randn(total, OUTPUTS, generator=generator))
            for _ in range(steps)]


def union_training(make_optimizer, batches):
    """The independent reference: one process, plain torch, every rank's samples at once."""
    return train_plainly(make_model(), make_optimizer, loss_fn, batches)


def assert_same_weights(model, reference):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("groups", [None, 0, 2], ids=["automatic-groups", "per-tensor", "two-groups"])
def test_uneven_batches_train_like_one_process_on_their_union(optimizer_name, groups, rank, size):
    sizes = counts(size)
    start = sum(sizes[:rank])
    batches = global_batches(sum(sizes))
    model = make_model()
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[optimizer_name](model.parameters()),
                                         named_parameters=model.named_parameters(), groups=groups)
    optimizer.set_local_samples(sizes[rank])
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, x[start:start + sizes[rank]], y[start:start + sizes[rank]]).backward()
        optimizer.step()
    reference = union_training(OPTIMIZERS[optimizer_name], batches)
    assert_same_weights(model, reference)
    if size > 1:  # the plain average of uneven batches is another gradient: the weights matter
        unweighted = make_model()
        plain = hvd.DistributedOptimizer(OPTIMIZERS[optimizer_name](unweighted.parameters()),
                                         named_parameters=unweighted.named_parameters(), groups=groups)
        for x, y in batches:
            plain.zero_grad()
            loss_fn(unweighted, x[start:start + sizes[rank]], y[start:start + sizes[rank]]).backward()
            plain.step()
        assert not np.allclose(unweighted[0].weight.detach().numpy(), reference[0].weight.detach().numpy(),
                               rtol=1e-3, atol=1e-4)


def test_a_load_balancers_sizes_weigh_the_gradients_as_they_change(rank, size):
    global_batch = 60
    balancer = hvd.LoadBalancer(global_batch, smoothing=1.0, hysteresis=0.0, warmup_steps=0)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), load_balancer=balancer)
    batches = global_batches(global_batch)
    history = []
    for step, (x, y) in enumerate(batches):
        mine = torch.as_tensor(balancer.slice(np.arange(global_batch)))
        optimizer.zero_grad()
        loss_fn(model, x[mine], y[mine]).backward()
        optimizer.step()
        # The last rank is slow for the first half of the run, then as fast as the others.
        slow = 3.0 if rank == size - 1 and size > 1 and step < STEPS // 2 else 1.0
        balancer.record(len(mine), len(mine) * 0.001 * slow)
        history.append(balancer.rebalance())
    if size > 1:
        assert len({tuple(sizes) for sizes in history}) > 1 and min(history[0]) < global_batch / size - 2, history
    reference = union_training(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batches)
    assert_same_weights(model, reference)


def after_one_backward(samples):
    """(model, its DistributedOptimizer given `samples`, the batch) once backward has run on
    `samples` rows: the step's gradients are being averaged."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    optimizer.set_local_samples(samples)
    x, y = global_batches(max(samples, 2), steps=1)[0]
    loss_fn(model, x, y).backward()
    return model, optimizer, (x, y)


def test_set_local_samples_after_backward_raises_and_the_step_still_completes(rank, size):
    model, optimizer, (x, y) = after_one_backward(3)
    if size > 1:  # one rank reduces nothing, so its count has no step to be late for
        with pytest.raises(RuntimeError, match="already being averaged with weight 3.*before loss.backward"):
            optimizer.set_local_samples(4)
    optimizer.step()  # with every rank's weight 3: the plain average
    reference = union_training(lambda p: torch.optim.SGD(p, lr=0.1), [(x, y)])
    assert_same_weights(model, reference)


def test_counts_that_sum_to_zero_raise_at_step_on_every_rank(rank, size):
    _, optimizer, _ = after_one_backward(0)
    if size == 1:  # one rank reduces nothing: its own gradient, whatever its count
        optimizer.step()
        return
    with pytest.raises(ValueError, match="sum to 0"):
        optimizer.step()


def test_weighting_with_another_op_is_refused(rank, size):
    model = make_model()
    with pytest.raises(ValueError, match="needs op=Average"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 load_balancer=hvd.LoadBalancer(8))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum)
    with pytest.raises(ValueError, match="needs op=Average"):
        optimizer.set_local_samples(4)


# -- BalancedSampler ------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True], ids=["keep-last", "drop-last"])
def test_a_balanced_sampler_covers_every_sample_once_per_epoch_while_the_sizes_move(drop_last, rank, size):
    length, global_batch = 203, 24  # 8 full global batches and 11 samples left
    balancer = hvd.LoadBalancer(global_batch, smoothing=1.0, hysteresis=0.0, warmup_steps=0)
    sampler = hvd.BalancedSampler(length, balancer, seed=5, drop_last=drop_last)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(length)), batch_sampler=sampler)
    steps = 8 if drop_last else 9
    assert len(sampler) == len(loader) == steps
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        mine, sizes_seen = [], []
        for step, (x,) in enumerate(loader):
            sizes_seen.append(balancer.sizes())
            if (step + 1) * global_batch <= length:  # a full global batch: this rank's size now
                assert len(x) == balancer.local_batch_size(), (step, sizes_seen[-1])
            mine.append(x.tolist())
            # The last rank turns 3x slower from the epoch's fourth step: the sizes move mid-epoch,
            # and back to even at the next epoch's start.
            slow = 3.0 if rank == size - 1 and size > 1 and step >= 3 else 1.0
            balancer.record(len(x), len(x) * 0.001 * slow)
            balancer.rebalance()
        everyones = hvd.allgather_object(mine)
        assert [len(batches) for batches in everyones] == [steps] * size
        taken = sorted(index for batches in everyones for batch in batches for index in batch)
        covered = steps * global_batch if drop_last else length
        assert len(taken) == covered and len(set(taken)) == covered and set(taken) <= set(range(length))
        if not drop_last:
            assert taken == list(range(length))
        # Each step's shares, in rank order, are one contiguous piece of the epoch's order.
        orders.append([index for step in range(steps) for batches in everyones for index in batches[step]])
        if size > 1:
            assert len({tuple(sizes) for sizes in sizes_seen}) > 1, sizes_seen
            assert sizes_seen[-1][-1] < global_batch / size - 2, sizes_seen
    assert orders[0] != orders[1]  # each epoch its own shuffle


def test_a_balanced_sampler_follows_set_epoch_and_seed_alike_on_every_rank(rank, size):
    balancer = hvd.LoadBalancer(12)
    first = hvd.BalancedSampler(range(40), balancer, seed=3)
    again = hvd.BalancedSampler(40, balancer, seed=3)
    assert list(first) == list(again)
    again.set_epoch(1)
    assert list(first) != list(again)
    in_order = hvd.BalancedSampler(40, balancer, shuffle=False)
    start = balancer.offset()
    assert list(in_order)[0] == list(range(start, start + balancer.local_batch_size()))
    # Every rank draws the same permutation: the first global batch's shares, gathered, hold no repeat.
    gathered = hvd.allgather_object(list(first)[0])
    assert len({index for share in gathered for index in share}) == sum(map(len, gathered)) == 12
