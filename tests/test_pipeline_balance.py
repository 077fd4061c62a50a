"""Pipeline stages split by cost (hvdplus.torch.pipeline.split_sequential's balance="time" and
"parameters", and hvdplus.common.contiguous_split): the contiguous split whose costliest stage
is cheapest, checked against every split there is."""

import itertools
import random

import pytest

from hvdplus.common.contiguous_split import balanced_counts

torch = pytest.importorskip("torch")

from hvdplus.torch import stage_costs  # noqa: E402
from hvdplus.torch.pipeline import split_sequential  # noqa: E402


def costliest_part(costs, counts):
    bounds = list(itertools.accumulate([0, *counts]))
    return max(sum(costs[start:end]) for start, end in zip(bounds, bounds[1:]))


def least_costliest_part(costs, parts):
    """By trying every split: the reference."""
    return min(costliest_part(costs, [end - start for start, end in zip((0, *cuts), (*cuts, len(costs)))])
               for cuts in itertools.combinations(range(1, len(costs)), parts - 1))


def test_the_split_is_as_good_as_the_best_of_every_split():
    generator = random.Random(3)
    for _ in range(300):
        layers = generator.randint(1, 9)
        parts = generator.randint(1, layers)
        costs = [generator.choice([0.0, generator.random(), generator.randint(1, 5)]) for _ in range(layers)]
        counts = balanced_counts(costs, parts)
        assert len(counts) == parts and sum(counts) == layers and min(counts) >= 1, (costs, parts, counts)
        assert costliest_part(costs, counts) == pytest.approx(least_costliest_part(costs, parts)), (costs, parts)


def test_a_costly_layer_gets_a_stage_of_its_own_and_ties_cut_early():
    assert balanced_counts([1, 1, 1, 5], 2) == [3, 1]
    assert balanced_counts([5, 1, 1, 1], 2) == [1, 3]
    assert balanced_counts([1, 1, 1, 1], 2) == [2, 2]
    assert balanced_counts([1, 1, 1, 5], 3) == [1, 2, 1]  # 5 either way: the earliest cuts


@pytest.mark.parametrize("costs, parts", [([1, 2], 3), ([1, 2], 0), ([1, -1, 2], 2)])
def test_impossible_splits_and_negative_costs_raise(costs, parts):
    with pytest.raises(ValueError, match="balanced_counts"):
        balanced_counts(costs, parts)


class Repeated(torch.nn.Module):
    """A Linear and tanh applied `times` times: `times` as costly as once."""

    def __init__(self, times, width):
        super().__init__()
        self.times = times
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        for _ in range(self.times):
            x = torch.tanh(self.linear(x))
        return x


def costly_last_model(width=512):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Repeated(times, width) for times in (1, 1, 1, 5)])


def test_split_by_time_puts_a_layer_five_times_as_costly_alone_on_a_stage():
    model = costly_last_model()
    sample = torch.randn(64, 512)
    stages = split_sequential(model, 2, balance="time", sample=sample)
    assert [len(stage) for stage in stages] == [3, 1]
    assert stages[1][0] is model[3]
    # By count, the costly layer would share its stage: the split that time avoids.
    assert [len(stage) for stage in split_sequential(model, 2)] == [2, 2]


def test_measuring_leaves_the_gradients_as_they_were():
    model = costly_last_model(width=16)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 0.5)
    seconds = stage_costs.layer_seconds(list(model), torch.randn(4, 16), repeats=2)
    assert len(seconds) == 4 and min(seconds) > 0
    assert all(torch.equal(parameter.grad, torch.full_like(parameter, 0.5)) for parameter in model.parameters())


def test_split_by_parameters_balances_memory():
    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10), torch.nn.Linear(10, 10),
                                torch.nn.Linear(10, 10))
    assert stage_costs.layer_parameters(list(model)) == [10100, 1010, 110, 110]
    assert [len(stage) for stage in split_sequential(model, 2, balance="parameters")] == [1, 3]


def test_bad_balance_arguments_raise_clearly():
    model = costly_last_model(width=8)
    with pytest.raises(ValueError, match='balance="time" needs sample='):
        split_sequential(model, 2, balance="time")
    with pytest.raises(ValueError, match="expected \"time\", \"parameters\""):
        split_sequential(model, 2, balance="flops")
    with pytest.raises(ValueError, match="4 layers cannot make 5"):
        split_sequential(model, 5, balance="parameters")


def test_measuring_leaves_batchnorm_statistics_and_dropout_randomness_as_they_were():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5))
    statistics_before = [buffer.clone() for buffer in model.buffers()]
    sample = torch.randn(16, 8)
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    stage_costs.layer_seconds(list(model), sample, repeats=2)
    assert all(torch.equal(now, before) for now, before in zip(model.buffers(), statistics_before))
    assert torch.equal(torch.rand(3), expected_draw)
