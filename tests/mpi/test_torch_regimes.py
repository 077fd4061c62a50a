"""Local SGD, PeriodicModelAverager, DiLoCo and DistributedOptimizer(staleness=1) on real ranks
against a numpy replay of each algorithm over every rank (tests/testkit/regime_replay.py), at
rtol 1e-6: each rank trains a float64 linear model on its own data, and its parameters after
every step must be the replay's for that rank. tests/test_training_regimes.py runs this file at
2 and 3 ranks."""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.regime_replay import (  # noqa: E402
    BATCH, FEATURES, RTOL, THETA0, Adam, Sgd, assert_follows, assert_ranks_drift_apart,
    assert_state_averaging_matters, assert_unlike_training_alone, gradient, rank_data, replay_delayed, replay_diloco,
    replay_local_sgd, replay_synchronous)

pytestmark = pytest.mark.timeout(120)

LR = 0.05
# Each optimizer by name: (the torch one, the replay's).
OPTIMIZERS = {
    "sgd-momentum": (lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9), lambda: Sgd(LR, momentum=0.9)),
    "adam": (lambda params: torch.optim.Adam(params, lr=LR), lambda: Adam(LR)),
}


def make_model():
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(THETA0[:-1]).view(1, -1))
        model.bias.copy_(torch.from_numpy(THETA0[-1:]))
    return model


def flat(model):
    return torch.cat([model.weight.detach().view(-1), model.bias.detach()]).numpy().copy()


def train(model, optimizer, steps, after_step=None, start=0):
    """This rank's parameters after each of steps `start` to `steps - 1` on its own data (rank_data)."""
    x, y = (torch.from_numpy(array) for array in rank_data(hvd.rank(), steps))
    trajectory = []
    for step in range(start, steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[step]), y[step].view(-1, 1)).backward()
        optimizer.step()
        if after_step is not None:
            after_step(step)
        trajectory.append(flat(model))
    return np.array(trajectory)


def test_local_sgd_averaging_every_step_is_synchronous_training(rank, size):
    # With SGD and momentum, averaging the parameters after every local step is averaging the
    # gradients: the momentum buffers' mean follows the mean gradient, since the update is linear.
    torch_sgd, replay_sgd = OPTIMIZERS["sgd-momentum"]
    steps = 6
    local_model, synchronous_model = make_model(), make_model()
    local = hvd.LocalSGD(torch_sgd(local_model.parameters()), local_model, period=1)
    synchronous = hvd.DistributedOptimizer(torch_sgd(synchronous_model.parameters()),
                                           named_parameters=synchronous_model.named_parameters())
    replay = replay_synchronous(replay_sgd, size, steps)
    assert_follows(train(local_model, local, steps), replay, rank)
    assert_follows(train(synchronous_model, synchronous, steps), replay, rank)
    assert_unlike_training_alone(replay_sgd, replay, rank, steps)


@pytest.mark.parametrize("average_state", [False, True], ids=["parameters", "parameters-and-state"])
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_local_sgd_matches_its_replay(optimizer_name, average_state, rank, size):
    torch_optimizer, replay_optimizer = OPTIMIZERS[optimizer_name]
    steps, period, warmup = 12, 4, 3
    model = make_model()
    optimizer = hvd.LocalSGD(torch_optimizer(model.parameters()), model.named_parameters(), period=period,
                             warmup_steps=warmup, average_optimizer_state=average_state)
    assert isinstance(optimizer, type(torch_optimizer([torch.zeros(1, requires_grad=True)])))
    replay = replay_local_sgd(replay_optimizer, size, steps, period, warmup, average_state)
    assert_follows(train(model, optimizer, steps), replay, rank)
    assert_ranks_drift_apart(replay, warmup + 1)
    assert optimizer.state_dict()["local_sgd_step"] == steps
    assert_state_averaging_matters(replay_optimizer, replay, rank, steps, period, warmup, average_state)


def test_periodic_model_averager_in_a_users_loop_matches_the_replay(rank, size):
    torch_sgd, replay_sgd = OPTIMIZERS["sgd-momentum"]
    steps, period, warmup = 7, 3, 2
    model = make_model()
    averager = hvd.PeriodicModelAverager(model, period=period, warmup_steps=warmup)
    averaged = []
    # Before warmup_steps the replay averages gradients, which a user's loop without a
    # DistributedOptimizer does not: a warm-up as long as training keeps to local steps there.
    replay = replay_local_sgd(replay_sgd, size, steps, period, 0)

    def average(step):
        averaged.append(averager.average_parameters(step + warmup))

    assert_follows(train(model, torch_sgd(model.parameters()), steps, average), replay, rank)
    assert averaged == [step % period == 0 for step in range(steps)]


@pytest.mark.parametrize("inner_name", list(OPTIMIZERS))
def test_diloco_with_a_nesterov_outer_step_matches_its_replay(inner_name, rank, size):
    torch_inner, replay_inner = OPTIMIZERS[inner_name]
    steps, period = 15, 5
    model = make_model()
    optimizer = hvd.DiLoCo(torch_inner(model.parameters()), model, period=period)
    replay = replay_diloco(replay_inner, size, steps, period, lambda: Sgd(0.7, momentum=0.9, nesterov=True))
    assert_follows(train(model, optimizer, steps), replay, rank)
    assert_ranks_drift_apart(replay, period)
    assert optimizer.state_dict()["diloco"]["step"] == steps


def test_diloco_takes_an_outer_optimizer_of_ones_own(rank, size):
    steps, period = 6, 3
    model = make_model()
    outer = functools.partial(torch.optim.SGD, lr=0.5)
    optimizer = hvd.DiLoCo(torch.optim.SGD(model.parameters(), lr=LR), model.named_parameters(),
                           outer_optimizer=outer, period=period)
    replay = replay_diloco(lambda: Sgd(LR), size, steps, period, lambda: Sgd(0.5))
    assert_follows(train(model, optimizer, steps), replay, rank)


def trained_in_two_runs(wrap, steps, stop):
    """This rank's trajectory of `steps` steps, taken as `stop` steps by one wrapped optimizer
    (`wrap(model)`), then the rest by a fresh one on a fresh model that loads the first's
    parameters and state_dict(), as a resumed job does."""
    model = make_model()
    first = wrap(model)
    before = train(model, first, stop)
    resumed_model = make_model()
    resumed_model.load_state_dict(model.state_dict())
    resumed = wrap(resumed_model)
    resumed.load_state_dict(first.state_dict())
    after = train(resumed_model, resumed, steps, start=stop)
    resumed.state_dict()  # a delayed optimizer's last all-reduces finish here (see train_delayed)
    return np.concatenate([before, after])


def test_local_sgd_resumes_from_its_state_dict_between_averagings(rank, size):
    torch_adam, replay_adam = OPTIMIZERS["adam"]
    steps, period, warmup = 10, 4, 3

    def wrap(model):
        return hvd.LocalSGD(torch_adam(model.parameters()), model, period=period, warmup_steps=warmup,
                            average_optimizer_state=True)

    replay = replay_local_sgd(replay_adam, size, steps, period, warmup, average_state=True)
    assert_follows(trained_in_two_runs(wrap, steps, stop=5), replay, rank)


def test_diloco_resumes_from_its_state_dict_between_outer_steps(rank, size):
    torch_sgd, replay_sgd = OPTIMIZERS["sgd-momentum"]
    steps, period = 15, 5

    def wrap(model):
        return hvd.DiLoCo(torch_sgd(model.parameters()), model, period=period)

    # Stopped after step 7: theta_outer and the outer momentum of the first two outer steps must carry over.
    replay = replay_diloco(replay_sgd, size, steps, period, lambda: Sgd(0.7, momentum=0.9, nesterov=True))
    assert_follows(trained_in_two_runs(wrap, steps, stop=8), replay, rank)


def all_ranks_alike(model):
    """Whether every rank holds the same parameters, bit for bit."""
    thetas = hvd.allgather_object(flat(model).tobytes(), name="regimes.alike")
    return all(theta == thetas[0] for theta in thetas)


def wrapped_for(regime, model, name, **settings):
    sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if regime == "local_sgd":
        return hvd.LocalSGD(sgd, model, name=name, **settings)
    return hvd.DiLoCo(sgd, model, name=name, **settings)


def steps_taken(optimizer):
    own = optimizer.state_dict()
    return own["local_sgd_step"] if "local_sgd_step" in own else own["diloco"]["step"]


@pytest.mark.parametrize("regime, settings, agreed", [
    # Steps 0-2 synchronous, then averages after steps 3 and 7.
    ("local_sgd", {"period": 4, "warmup_steps": 3}, [True, True, True, True, False, False, False, True, False]),
    # Outer steps after steps 4 and 9.
    ("diloco", {"period": 5}, [False, False, False, False, True, False, False, False, False, True]),
])
def test_averaged_says_where_every_ranks_parameters_are_the_same(regime, settings, agreed, rank, size):
    model = make_model()
    optimizer = wrapped_for(regime, model, "agreed", **settings)
    averaged, alike = [optimizer.averaged], [all_ranks_alike(model)]

    def after_step(step):
        averaged.append(optimizer.averaged)
        alike.append(all_ranks_alike(model))

    train(model, optimizer, len(agreed), after_step)
    assert averaged == [True] + agreed
    if size > 1:  # the ranks train on data of their own, so their parameters differ after a local step
        assert alike == [True] + agreed


@pytest.mark.parametrize("regime, settings, first_steps", [("local_sgd", {"period": 4}, 1),
                                                            ("diloco", {"period": 5}, 0)])
def test_torch_state_commits_only_where_the_ranks_parameters_agree(regime, settings, first_steps, rank, size):
    model = make_model()
    optimizer = wrapped_for(regime, model, "commits", **settings)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    train(model, optimizer, first_steps)  # LocalSGD averages after step 0; DiLoCo is yet to step
    state.commit()
    committed = flat(model)
    train(model, optimizer, 3, start=first_steps)
    name = "LocalSGD" if regime == "local_sgd" else "DiLoCo"
    with pytest.raises(ValueError, match=rf"^TorchState.commit\(\) of 'optimizer' with {name}: step 2 was a local "
                       r"step, so each rank holds parameters of its own until the ranks average after step 4; "
                       r"commit where optimizer.averaged is True$"):
        state.commit()
    state.restore()
    np.testing.assert_array_equal(flat(model), committed)
    assert steps_taken(optimizer) == first_steps and optimizer.averaged


@pytest.fixture
def job_still_works_afterwards(size):
    yield
    summed = hvd.allreduce(torch.ones(3, dtype=torch.float64), op=hvd.Sum, name="regimes.after")
    np.testing.assert_array_equal(summed.numpy(), np.full(3, size))


@pytest.mark.skipif(hvd.size() < 2, reason="ranks out of step need two ranks")
@pytest.mark.usefixtures("job_still_works_afterwards")
def test_a_rank_that_averages_at_another_step_raises_on_every_rank(rank, size):
    model = make_model()
    averager = hvd.PeriodicModelAverager(model, period=2, name="out_of_step")
    offset = 2 if rank == 1 else 0  # rank 1 counts its steps from 2: it averages after its step 2 first
    others = "rank 0 has 0" if size == 2 else f"ranks {', '.join(str(r) for r in range(size) if r != 1)} have 0"
    with pytest.raises(ValueError, match=f"PeriodicModelAverager: the ranks differ in step: {others}, rank 1 has 2"):
        for step in range(4):
            averager.average_parameters(step + offset)


@pytest.mark.skipif(hvd.size() < 2, reason="ranks out of step need two ranks")
@pytest.mark.usefixtures("job_still_works_afterwards")
def test_local_sgd_with_a_warm_up_of_its_own_on_one_rank_raises_on_every_rank(rank, size):
    model = make_model()
    with pytest.raises(ValueError, match=r"LocalSGD: the ranks differ in warmup_steps: .*rank 1 has 4"):
        hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR), model, period=2,
                     warmup_steps=4 if rank == 1 else 3, name="warm_up_of_its_own")


def test_bad_settings_are_refused():
    model = make_model()
    with pytest.raises(ValueError, match="LocalSGD: period must be an integer of at least 1, got 0"):
        hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR), model, period=0)
    with pytest.raises(ValueError, match="DiLoCo: period must be an integer of at least 1, got -1"):
        hvd.DiLoCo(torch.optim.SGD(model.parameters(), lr=LR), model, period=-1)


# -- bounded staleness: DistributedOptimizer(staleness=1) ---------------------------------------
STALE_OPTIMIZERS = {"sgd": (lambda params: torch.optim.SGD(params, lr=LR), lambda: Sgd(LR)), **OPTIMIZERS}


def delayed(model, optimizer_name="sgd-momentum", **kwargs):
    return hvd.DistributedOptimizer(STALE_OPTIMIZERS[optimizer_name][0](model.parameters()),
                                    named_parameters=model.named_parameters(), staleness=1, **kwargs)


def finished(optimizer, trajectory):
    """`trajectory`, once the last step's all-reduces, which no step applies, have finished
    (state_dict() waits for them): the next test's optimizer submits the same names."""
    optimizer.state_dict()
    return trajectory


@pytest.mark.parametrize("optimizer_name", list(STALE_OPTIMIZERS))
def test_staleness_one_applies_the_previous_steps_averaged_gradients(optimizer_name, rank, size):
    steps = 8
    model = make_model()
    optimizer = delayed(model, optimizer_name)
    assert isinstance(optimizer, torch.optim.SGD if optimizer_name.startswith("sgd") else torch.optim.Adam)
    trajectory = finished(optimizer, train(model, optimizer, steps))
    np.testing.assert_array_equal(trajectory[0], THETA0)  # step 0 only sends its gradients
    replay = replay_delayed(STALE_OPTIMIZERS[optimizer_name][1], size, steps)
    assert_follows(trajectory, replay, rank)
    # Applying each step's own gradients, or not averaging them, ends elsewhere.
    synchronous = replay_synchronous(STALE_OPTIMIZERS[optimizer_name][1], size, steps)
    assert not np.allclose(replay[rank, 2], synchronous[rank, 1], rtol=RTOL)
    if size > 1:
        alone = replay_delayed(STALE_OPTIMIZERS[optimizer_name][1], 1, steps)
        assert not np.allclose(replay[0, -1], alone[0, -1], rtol=RTOL)


@pytest.mark.parametrize("groups", [None, 0], ids=["fused", "one-by-one"])
def test_staleness_keeps_every_ranks_parameters_identical(groups, rank, size):
    model = make_model()
    optimizer = delayed(model, groups=groups)
    trajectory = torch.from_numpy(finished(optimizer, train(model, optimizer, steps=7)))
    everyones = hvd.allgather(trajectory[None], name=f"staleness.identical.{groups}").numpy()
    assert everyones.shape == (size, 7, FEATURES + 1)
    for other in range(size):
        np.testing.assert_array_equal(everyones[other], everyones[0], err_msg=f"rank {other} against rank 0")
    if size > 1:  # the ranks' data differ, so training alone would not keep them together
        alone = replay_delayed(STALE_OPTIMIZERS["sgd-momentum"][1], 1, 7)
        assert not np.allclose(everyones[0, -1], alone[0, -1], rtol=RTOL)


def test_staleness_with_accumulated_passes_matches_the_replay(rank, size):
    # Two backward passes of half a batch each, each loss halved: their sum is the batch's gradient.
    steps = 6
    model = make_model()
    optimizer = delayed(model, backward_passes_per_step=2)
    x, y = (torch.from_numpy(array) for array in rank_data(rank, steps))
    half = BATCH // 2
    trajectory = []
    for step in range(steps):
        optimizer.zero_grad()
        for part in (slice(0, half), slice(half, BATCH)):
            loss = 0.5 * torch.nn.functional.mse_loss(model(x[step, part]), y[step, part].view(-1, 1))
            loss.backward()
        optimizer.step()
        trajectory.append(flat(model))
    replay = replay_delayed(STALE_OPTIMIZERS["sgd-momentum"][1], size, steps)
    assert_follows(finished(optimizer, np.array(trajectory)), replay, rank)


def test_staleness_synchronize_puts_the_gradient_that_step_applies_in_grad(rank, size):
    steps = 5
    replay = replay_delayed(STALE_OPTIMIZERS["sgd"][1], size, steps)
    data = [rank_data(r, steps) for r in range(size)]
    model = make_model()
    optimizer = delayed(model, "sgd")
    x, y = (torch.from_numpy(array) for array in data[rank])
    trajectory = []
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[step]), y[step].view(-1, 1)).backward()
        optimizer.synchronize()
        if step == 0:
            assert model.weight.grad is None and model.bias.grad is None
        else:
            # The ranks' mean gradient of step - 1, at the parameters step - 1 started from.
            theta = THETA0 if step == 1 else replay[rank, step - 2]
            expected = sum(gradient(theta, data[r][0][step - 1], data[r][1][step - 1]) for r in range(size)) / size
            got = torch.cat([model.weight.grad.view(-1), model.bias.grad]).numpy()
            np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
        with optimizer.skip_synchronize():
            optimizer.step()
        trajectory.append(flat(model))
    assert_follows(finished(optimizer, np.array(trajectory)), replay, rank)


def test_staleness_resumes_from_its_state_dict_with_the_pending_gradients(rank, size):
    steps, stop = 8, 3
    replay = replay_delayed(STALE_OPTIMIZERS["sgd-momentum"][1], size, steps)
    assert_follows(trained_in_two_runs(delayed, steps, stop), replay, rank)
    model = make_model()
    optimizer = delayed(model)
    train(model, optimizer, stop)
    state = optimizer.state_dict()["staleness"]
    assert state["steps"] == stop and len(state["gradients"]) == 2


def test_staleness_goes_on_through_broadcast_optimizer_state(rank, size):
    # Once before training (which primes the momentum buffers with a step on zero gradients) and
    # once in the middle, with every rank's last all-reduces in flight: rank 0's pending
    # gradients, the same as everyone's, are what the next step applies.
    steps, middle = 7, 3
    model = make_model()
    optimizer = delayed(model)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    before = train(model, optimizer, middle)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    after = finished(optimizer, train(model, optimizer, steps, start=middle))
    replay = replay_delayed(STALE_OPTIMIZERS["sgd-momentum"][1], size, steps)
    assert_follows(np.concatenate([before, after]), replay, rank)


def test_staleness_on_a_process_set_delays_the_gradients_inside_and_outside_it(even_and_odd_sets, rank, size):
    # Every rank wraps with the set of the even ranks: they average among themselves; an odd
    # rank, outside it, applies its own gradients, one step late as well.
    mine, other = even_and_odd_sets
    evens = mine if rank % 2 == 0 else other
    steps = 6
    model = make_model()
    optimizer = delayed(model, process_set=evens)
    trajectory = finished(optimizer, train(model, optimizer, steps))
    np.testing.assert_array_equal(trajectory[0], THETA0)
    averaged = list(range(0, size, 2)) if rank % 2 == 0 else [rank]
    replay = replay_delayed(STALE_OPTIMIZERS["sgd-momentum"][1], 1, steps, averaged=averaged)
    assert_follows(trajectory, replay, 0)


def test_staleness_refuses_what_it_does_not_support(size):
    model = make_model()
    with pytest.raises(ValueError, match="staleness must be 0 .* got 2"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), staleness=2)
    balancer = hvd.LoadBalancer(global_batch_size=BATCH * size)
    with pytest.raises(ValueError, match=r"staleness=1, load_balancer=\.\.\.\): weighted averages"):
        delayed(model, load_balancer=balancer)
    optimizer = delayed(model)
    with pytest.raises(ValueError, match=r"set_local_samples\(8\): weighted averages of delayed gradients"):
        optimizer.set_local_samples(8)
    with pytest.raises(ValueError, match=r"step\(closure\): a closure's gradients would be applied a step late"):
        optimizer.step(lambda: 0.0)


@pytest.mark.skipif(hvd.size() < 2, reason="a gradient is all-reduced only with two ranks or more")
def test_staleness_refuses_sparse_gradients_on_every_rank():
    embedding = torch.nn.Embedding(5, 2, sparse=True, dtype=torch.float64)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=LR),
                                         named_parameters=embedding.named_parameters(), staleness=1)
    with pytest.raises(ValueError, match="the gradient of 'weight' is sparse .* delayed gradients are dense only"):
        embedding(torch.tensor([1, 3])).sum().backward()
    del optimizer
