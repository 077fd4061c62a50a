"""ZeroRedundancyOptimizer on real ranks: after 50 steps its parameters equal those of
hvd.DistributedOptimizer and of one process training plain torch on the whole batches, at rtol
1e-6, for stage 1 and 2; each rank holds the state (and in stage 2 the gradients) of its share
only; checkpoints reload; and mismatched use raises on every rank. tests/test_zero.py runs this
file at 2, 3 and 4 ranks (the six parameters never divide evenly), and its checkpoint tests
across jobs of different sizes."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from hvdplus.common.size_partition import owned_by, partition_by_size  # noqa: E402
from testkit.zero_training import (  # noqa: E402
    LR, OPTIMIZERS, RTOL, STEPS, flat, global_batch, groups_of, loss_of, make_model, my_batch, state_bytes, train,
    train_plainly, zero_optimizer)

pytestmark = pytest.mark.timeout(120)

@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fifty_steps_equal_distributed_optimizer_and_plain_torch(name, stage):
    cls, defaults = OPTIMIZERS[name]
    model = make_model()
    start = flat(model)
    reference = make_model()
    wrapped = hvd.DistributedOptimizer(cls(groups_of(reference), **defaults),
                                       named_parameters=reference.named_parameters())
    expected = train(reference, wrapped, STEPS)
    plain = make_model()
    plainly = train_plainly(plain, cls(groups_of(plain), **defaults), STEPS)
    got = train(model, zero_optimizer(model, name, stage), STEPS)
    assert not np.allclose(got, start, rtol=1e-3)  # training moved the parameters
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(got, plainly, rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("stage", [1, 2])
def test_backward_passes_per_step_and_fp16_compression_equal_distributed_optimizer(stage):
    cls, defaults = OPTIMIZERS["adam"]
    reference = make_model()
    wrapped = hvd.DistributedOptimizer(cls(groups_of(reference), **defaults), compression=hvd.Compression.fp16,
                                       backward_passes_per_step=2, named_parameters=reference.named_parameters())
    expected = train(reference, wrapped, 20, passes=2)
    model = make_model()
    got = train(model, zero_optimizer(model, "adam", stage, compression=hvd.Compression.fp16,
                                      backward_passes_per_step=2), 20, passes=2)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
    # fp16 on the wire changed the result: the compression was applied.
    plain = make_model()
    plainly = train_plainly(plain, cls(groups_of(plain), **defaults), 20)
    assert not np.allclose(got, plainly, rtol=1e-9, atol=0)


def test_the_learning_rate_of_each_group_and_a_scheduler_apply():
    model = make_model()
    optimizer = zero_optimizer(model, "sgd-momentum", 1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    plain = make_model()
    plain_optimizer = torch.optim.SGD(groups_of(plain), **OPTIMIZERS["sgd-momentum"][1])
    plain_scheduler = torch.optim.lr_scheduler.StepLR(plain_optimizer, step_size=5, gamma=0.5)
    for step in range(12):
        train(model, optimizer, step + 1, start=step)
        scheduler.step()
        train_plainly(plain, plain_optimizer, step + 1, start=step)
        plain_scheduler.step()
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([LR * 0.5 * 0.25, LR * 0.25])
    np.testing.assert_allclose(flat(model), flat(plain), rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("stage", [1, 2])
def test_each_rank_holds_the_state_of_its_share_only(stage):
    model = make_model()
    params = list(model.parameters())
    optimizer = zero_optimizer(model, "adam", stage)
    train(model, optimizer, 2)
    owner_of = partition_by_size([p.numel() * p.element_size() for p in params], hvd.size())
    mine = owned_by(owner_of, hvd.rank())
    assert {id(p) for p in optimizer.state} == {id(params[i]) for i in mine}
    # Adam's two moments per parameter, and its step count (one float32 each).
    expected = sum(2 * params[i].numel() * params[i].element_size() + 4 for i in mine)
    held = state_bytes(optimizer.state)
    assert held == expected
    plain_model = make_model()
    plain = torch.optim.Adam(plain_model.parameters(), lr=LR)
    train_plainly(plain_model, plain, 1)
    whole = state_bytes(plain.state)
    everyone = hvd.allgather_object(held)
    assert sum(everyone) == whole
    # Balanced: no rank holds more than 1/N of the whole plus the largest parameter's share.
    largest = max(2 * p.numel() * p.element_size() + 4 for p in params)
    assert max(everyone) <= whole / hvd.size() + largest


def test_stage_two_keeps_only_the_gradients_of_its_share():
    model = make_model()
    params = list(model.parameters())
    optimizer = zero_optimizer(model, "adam", 2)
    optimizer.zero_grad()
    loss_of(model, *my_batch(0)).backward()
    optimizer.synchronize()
    owner_of = partition_by_size([p.numel() * p.element_size() for p in params], hvd.size())
    holding = [index for index, p in enumerate(params) if p.grad is not None]
    assert holding == owned_by(owner_of, hvd.rank())
    # The gradients it holds are the whole batch's average.
    plain = make_model()
    loss_of(plain, *global_batch(0)).backward()
    for index in holding:
        np.testing.assert_allclose(params[index].grad.numpy(), list(plain.parameters())[index].grad.numpy(),
                                   rtol=RTOL, atol=1e-12)
    with optimizer.skip_synchronize():
        optimizer.step()


@pytest.mark.parametrize("stage", [1, 2])
def test_a_shard_and_a_consolidated_dict_reload_and_training_goes_on(stage, tmp_path):
    model = make_model()
    optimizer = zero_optimizer(model, "adamw", stage)
    train(model, optimizer, 10)
    # Copies, as with any torch optimizer: a state dict holds the optimizer's own tensors.
    shard = copy.deepcopy(optimizer.state_dict())
    assert set(shard["state"]) == set(shard["zero_shard"]["owned"])
    full = optimizer.consolidate_state_dict(to=0)
    assert (full is not None) == (hvd.rank() == 0)
    everything = copy.deepcopy(optimizer.consolidate_state_dict(to=None))
    assert sorted(everything["state"]) == list(range(6))
    plain_model = make_model()
    plain = torch.optim.AdamW(groups_of(plain_model), **OPTIMIZERS["adamw"][1])
    train_plainly(plain_model, plain, 10)
    # The consolidated dict is a torch optimizer's: a plain AdamW takes it.
    torch_dict = plain.state_dict()
    for index, per_param in torch_dict["state"].items():
        for key, value in per_param.items():
            np.testing.assert_allclose(np.asarray(everything["state"][index][key]), np.asarray(value),
                                       rtol=RTOL, atol=1e-12)
    saved_params = [p.detach().clone() for p in model.parameters()]
    expected = train(model, optimizer, 20, start=10)
    for source in (shard, everything):
        again = make_model()
        with torch.no_grad():
            for p, value in zip(again.parameters(), saved_params):
                p.copy_(value)
        resumed = zero_optimizer(again, "adamw", stage)
        resumed.load_state_dict(source)
        np.testing.assert_allclose(train(again, resumed, 20, start=10), expected, rtol=RTOL, atol=1e-12)


def test_a_plain_torch_state_dict_loads():
    plain_model = make_model()
    plain = torch.optim.Adam(groups_of(plain_model), lr=LR)
    train_plainly(plain_model, plain, 5)
    model = make_model()
    with torch.no_grad():
        for p, q in zip(model.parameters(), plain_model.parameters()):
            p.copy_(q)
    optimizer = zero_optimizer(model, "adam", 1)
    optimizer.load_state_dict(copy.deepcopy(plain.state_dict()))
    np.testing.assert_allclose(train(model, optimizer, 15, start=5), train_plainly(plain_model, plain, 15, start=5),
                               rtol=RTOL, atol=1e-12)


def test_the_wrong_ranks_shard_is_refused():
    assert hvd.size() >= 2, "tests/test_zero.py runs this suite at 2 ranks or more"
    model = make_model()
    optimizer = zero_optimizer(model, "adam", 1)
    train(model, optimizer, 1)
    shards = hvd.allgather_object(optimizer.state_dict())
    other = shards[(hvd.rank() + 1) % hvd.size()]
    with pytest.raises(ValueError, match=f"shard of rank {(hvd.rank() + 1) % hvd.size()}"):
        optimizer.load_state_dict(other)
    optimizer.load_state_dict(shards)  # every shard together is the whole


def test_different_stages_on_different_ranks_raise_on_every_rank():
    model = make_model()
    with pytest.raises(ValueError, match=r"shard_gradients: rank 0 has True, ranks? 1"):
        zero_optimizer(model, "adam", 2 if hvd.rank() == 0 else 1)


def test_different_parameters_on_different_ranks_raise_on_every_rank():
    model = make_model()
    params = list(model.parameters())
    if hvd.rank() == hvd.size() - 1:
        params[2] = torch.nn.Parameter(torch.zeros(4, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"parameter 2 \(name, shape, dtype\): .*\(3, 7\).*\(4, 7\)"):
        hvd.ZeroRedundancyOptimizer(params, torch.optim.SGD, lr=LR)
    # The job goes on: nothing is left half-done.
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


def test_elastic_state_commits_and_restores_the_sharded_state():
    model = make_model()
    optimizer = zero_optimizer(model, "adam", 2)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    train(model, optimizer, 5)
    state.step = 5
    state.commit()
    expected = train(model, optimizer, 12, start=5)
    train(model, optimizer, 8, start=5)  # steps that the restore rolls back
    state.restore()
    assert state.step == 5
    np.testing.assert_allclose(train(model, optimizer, 12, start=5), expected, rtol=RTOL, atol=1e-12)
