"""DistributedOptimizer on k ranks against one process training on the whole batch."""

import copy

import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.torch_reference import train_plainly  # noqa: E402

BATCH_PER_RANK = 6
STEPS = 5


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def global_batches(size, steps=STEPS, per_rank=BATCH_PER_RANK):
    generator = torch.Generator().manual_seed(1234)
    return [(torch.randn(size * per_rank, 5, generator=generator), torch.randn(size * per_rank, 3, generator=generator))
            for _ in range(steps)]


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def single_process(make_optimizer, batches):
    """The independent reference: one process, the whole batch, no hvdplus at all."""
    return train_plainly(make_model(), make_optimizer, loss_fn, batches)


def rows(rank, tensor, per_rank=BATCH_PER_RANK):
    return tensor[rank * per_rank:(rank + 1) * per_rank]


def assert_same_parameters(model, reference, tol=1e-5):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("groups", [None, 2], ids=["per-tensor", "two-groups"])
def test_k_ranks_equal_one_process_with_k_times_the_batch(optimizer_name, groups, rank, size):
    batches = global_batches(size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[optimizer_name](model.parameters()),
                                         named_parameters=model.named_parameters(), groups=groups)
    assert isinstance(optimizer, type(OPTIMIZERS[optimizer_name]([torch.zeros(1, requires_grad=True)])))
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x), rows(rank, y)).backward()
        optimizer.step()
    assert_same_parameters(model, single_process(OPTIMIZERS[optimizer_name], batches))


def test_channels_last_parameters_train_like_one_process(rank, size):
    def conv_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(4 * 4 * 4, 2))

    generator = torch.Generator().manual_seed(7)
    batches = [(torch.randn(size * 3, 3, 6, 6, generator=generator), torch.randn(size * 3, 2, generator=generator))
               for _ in range(3)]
    model = conv_model().to(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()  # its gradient comes in the same layout
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters())
    reference = conv_model()
    plain = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x, 3), rows(rank, y, 3)).backward()
        optimizer.step()
        plain.zero_grad()
        loss_fn(reference, x, y).backward()
        plain.step()
    assert_same_parameters(model, reference)


def test_backward_passes_per_step_equals_a_larger_batch(rank, size):
    passes = 3
    batches = global_batches(size * passes, steps=2)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes)
    for x, y in batches:
        optimizer.zero_grad()
        for micro in range(passes):
            part = rank * passes + micro  # this rank's micro-batches, in order
            (loss_fn(model, rows(part, x), rows(part, y)) / passes).backward()
        optimizer.step()
    reference = single_process(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batches)
    assert_same_parameters(model, reference)


def test_fp16_compression_stays_close(rank, size):
    batches = global_batches(size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x), rows(rank, y)).backward()
        optimizer.step()
    # float16 keeps ~3 decimal digits of each gradient.
    assert_same_parameters(model, single_process(lambda p: torch.optim.SGD(p, lr=0.1), batches), tol=2e-3)


def test_explicit_synchronize_with_clipping_and_skip_synchronize(rank, size):
    batches = global_batches(size, steps=3)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters())
    reference = make_model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x), rows(rank, y)).backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with optimizer.skip_synchronize():
            optimizer.step()
        ref_optimizer.zero_grad()
        loss_fn(reference, x, y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_optimizer.step()
    assert_same_parameters(model, reference)


HOROVODS_WORDS = (
    "optimizer.step() called without optimizer.skip_synchronize() context after optimizer.synchronize(). "
    "This can cause training slowdown. You may want to consider using optimizer.skip_synchronize() context if you "
    "use optimizer.synchronize() in your code.")


def test_step_after_synchronize_without_skip_synchronize_warns_in_horovods_words(rank, size):
    batches = global_batches(size, steps=2)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters())
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x), rows(rank, y)).backward()
        optimizer.synchronize()
        with pytest.warns(UserWarning) as caught:
            optimizer.step()
        assert [str(w.message) for w in caught if "skip_synchronize" in str(w.message)] == [HOROVODS_WORDS]
    # Synchronizing again averages gradients the ranks already share: the step is unchanged.
    assert_same_parameters(model, single_process(lambda p: torch.optim.SGD(p, lr=0.5), batches))


def test_unused_parameters_and_schedulers_and_state_dict(rank, size):
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(2))  # never used in the loss
    params = list(model.parameters()) + [extra]
    named = list(model.named_parameters()) + [("extra", extra)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = global_batches(size, steps=1)[0]
    optimizer.zero_grad()
    loss_fn(model, rows(rank, x), rows(rank, y)).backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert torch.equal(extra.detach(), torch.ones(2))
    restored = torch.optim.SGD(params, lr=1.0)
    restored.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert restored.param_groups[0]["lr"] == pytest.approx(0.05)


def test_named_parameter_errors():
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicate names: 0.weight"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named + [named[0]])
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named[:2])


@pytest.mark.skipif(hvd.size() < 2, reason="a mismatch needs two ranks")
def test_models_that_differ_across_ranks_raise_naming_the_parameters(rank):
    width = 3 if rank == 0 else 2
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(2, 4)).sum().backward()
    with pytest.raises(hvd.TensorMismatchError) as info:
        optimizer.step()
    message = str(info.value)
    assert "Mismatched member shapes" in message and "rank 0 had ((1,), (1, 3), (3,), (3, 4))" in message
    assert "members of 'grads.1.bias': 0 '1.bias', 1 '1.weight', 2 '0.bias', 3 '0.weight'" in message
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(hvd.size())))


@pytest.mark.skipif(hvd.size() < 2, reason="hooks are only installed with several ranks")
def test_zero_grad_before_step_is_refused(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x, y = global_batches(size, steps=1)[0]
    loss_fn(model, rows(rank, x), rows(rank, y)).backward()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called while gradients were still being all-reduced"):
        optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()


def test_sparse_gradients_allgathered_or_densified(rank, size):
    # A sparse embedding beside a dense layer: by default both fall in one fusion group.
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
        reference = copy.deepcopy(model)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                             named_parameters=model.named_parameters(),
                                             sparse_as_dense=sparse_as_dense)
        ids = [torch.tensor([r % 10, (3 * r + 1) % 10, 7]) for r in range(size)]
        optimizer.zero_grad()
        model(ids[rank]).pow(2).sum().backward()
        optimizer.step()
        # Reference: the average over ranks of each rank's gradient, applied once.
        grads = [torch.autograd.grad(reference(ids[r]).pow(2).sum(), list(reference.parameters()))
                 for r in range(size)]
        for index, (param, before) in enumerate(zip(model.parameters(), reference.parameters())):
            total = sum(g[index].to_dense() for g in grads)
            expected = before.detach() - 0.5 * total / size
            torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-5)


def test_broadcast_parameters_and_optimizer_state(rank, size):
    model = make_model(seed=rank)  # every rank starts differently
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.5 + 0.1 * rank)
    if rank == 0:
        x, y = global_batches(1, steps=1)[0]
        loss_fn(model, x, y).backward()
        optimizer.step()  # only the root has momentum buffers
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    root_model, root_optimizer = hvd.broadcast_object((model.state_dict(), optimizer.state_dict()), root_rank=0)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, root_model[name])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.5)
    for index, state in optimizer.state_dict()["state"].items():
        assert torch.equal(state["momentum_buffer"], root_optimizer["state"][index]["momentum_buffer"])
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=size - 1)


def with_idle_parameters(model):
    """`model` with a parameter that its forward never uses, so it never gets a gradient,
    and a frozen one."""
    model.register_parameter("idle", torch.nn.Parameter(torch.randn(4)))
    model.register_parameter("frozen", torch.nn.Parameter(torch.randn(3), requires_grad=False))
    return model


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_broadcast_optimizer_state_primes_a_fresh_optimizer_as_horovod_does(optimizer_name, rank, size):
    # Horovod gives a fresh optimizer's trainable parameters zero gradients and takes a step,
    # so the state exists everywhere (Adam counts that step); a program may read p.grad after.
    model = with_idle_parameters(make_model(seed=rank))
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[optimizer_name](model.parameters()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = copy.deepcopy(model.state_dict())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert torch.equal(model.idle.grad, torch.zeros(4)) and model.frozen.grad is None
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} changed"

    # The reference: one process that primes as Horovod does, then trains on whole batches.
    reference = with_idle_parameters(make_model(seed=0))
    reference_optimizer = OPTIMIZERS[optimizer_name](reference.parameters())
    for p in reference.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    reference_optimizer.step()
    mine, root = optimizer.state_dict()["state"], hvd.broadcast_object(optimizer.state_dict(), root_rank=0)["state"]
    expected = reference_optimizer.state_dict()["state"]
    assert mine.keys() == root.keys() == expected.keys() and len(expected) == len(list(model.parameters())) - 1
    for index, state in expected.items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(mine[index][key]), torch.as_tensor(root[index][key]))
            assert torch.equal(torch.as_tensor(mine[index][key]), torch.as_tensor(value)), f"{key} of {index}"
    for x, y in global_batches(size, steps=3):
        optimizer.zero_grad()
        loss_fn(model, rows(rank, x), rows(rank, y)).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        loss_fn(reference, x, y).backward()
        reference_optimizer.step()
    assert_same_parameters(model, reference)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_adam_on_a_sparse_embedding_trains_like_one_process(sparse_as_dense, rank, size):
    # SparseAdam takes only sparse gradients: sparse_as_dense reduces them dense and hands
    # them back sparse, as Horovod does.
    def embedding():
        torch.manual_seed(0)
        return torch.nn.Embedding(12, 3, sparse=True)

    def loss(model, ids, y):
        return torch.nn.functional.mse_loss(model(ids).sum(1), y)

    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 12, (size * 4,), generator=generator), torch.randn(size * 4, generator=generator))
               for _ in range(STEPS)]
    model, reference = embedding(), embedding()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    reference_optimizer = torch.optim.SparseAdam(reference.parameters(), lr=0.05)
    for ids, y in batches:
        optimizer.zero_grad()
        loss(model, rows(rank, ids, 4), rows(rank, y, 4)).backward()
        optimizer.synchronize()
        grad = model.weight.grad
        assert grad.is_sparse and (grad.is_coalesced() or size == 1)  # one rank reduces nothing
        with optimizer.skip_synchronize():
            optimizer.step()
        reference_optimizer.zero_grad()
        loss(reference, ids, y).backward()
        reference_optimizer.step()
    assert_same_parameters(model, reference)


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_join_with_uneven_data_leaves_every_rank_with_the_last_joiners_state(optimizer_name, rank, size):
    # Rank r has STEPS - r batches (at least one): joined ranks contribute zeros, Average
    # still divides by size, and Join's hook hands everyone the last joiner's state.
    steps_of = [max(STEPS - r, 1) for r in range(size)]
    batches = global_batches(size)
    reference = make_model()
    reference_optimizer = OPTIMIZERS[optimizer_name](reference.parameters())
    for step, (x, y) in enumerate(batches):
        active = [r for r in range(size) if step < steps_of[r]]
        if not active:
            break
        reference_optimizer.zero_grad()
        (sum(loss_fn(reference, rows(r, x), rows(r, y)) for r in active) / size).backward()
        reference_optimizer.step()

    model = make_model(seed=rank)  # the broadcast below and Join put every rank right
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[optimizer_name](model.parameters()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with hvd.Join([optimizer]) as join:
        for x, y in batches[:steps_of[rank]]:
            optimizer.zero_grad()
            loss_fn(model, rows(rank, x), rows(rank, y)).backward()
            optimizer.step()
    assert steps_of[join.last_rank] == max(steps_of)
    assert_same_parameters(model, reference)
    mine = optimizer.state_dict()["state"]
    for index, state in reference_optimizer.state_dict()["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(torch.as_tensor(mine[index][key]), torch.as_tensor(value), rtol=1e-5,
                                       atol=1e-5, msg=f"{key} of parameter {index}")


def test_join_refuses_what_is_not_joinable_and_joins_when_the_block_raises(rank, size):
    with pytest.raises(TypeError, match="Join: int has no join_hook"):
        hvd.Join([3])
    with pytest.raises(RuntimeError, match="out of data early"):
        with hvd.Join():
            raise RuntimeError("out of data early")
    # Every rank joined as the block ended: the job goes on.
    torch.testing.assert_close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)))
