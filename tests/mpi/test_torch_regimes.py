"""Local SGD, PeriodicModelAverager and DiLoCo on real ranks against a numpy replay of each
algorithm over every rank (tests/testkit/regime_replay.py), at rtol 1e-6: each rank trains a
float64 linear model on its own data, and its parameters after every step must be the replay's
for that rank. tests/test_training_regimes.py runs this file at 2 and 3 ranks."""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.regime_replay import (  # noqa: E402
    FEATURES, THETA0, Adam, Sgd, assert_follows, assert_ranks_drift_apart, assert_state_averaging_matters,
    assert_unlike_training_alone, rank_data, replay_diloco, replay_local_sgd, replay_synchronous)

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
    return np.concatenate([before, train(resumed_model, resumed, steps, start=stop)])


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
