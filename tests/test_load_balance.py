"""The load balancer's arithmetic (hvdplus/common/batch_sizes.py) and the weighted average's
packing (hvdplus/common/weighted_average.py), in one process, against hand-computed cases and
properties. The balancer and the weighted all-reduce on real ranks: tests/mpi/test_load_balance.py,
which tests/test_mpi_suites.py runs at 1, 2 and 3 ranks."""

import random
from fractions import Fraction

import numpy as np
import pytest

from hvdplus.common.batch_sizes import balanced_sizes, departures, moves_enough
from hvdplus.common.weighted_average import weighted_buffer, weighted_result


@pytest.mark.parametrize("speeds, global_batch, minimum, expected", [
    ([1, 1], 64, 1, [32, 32]),
    ([1, 2], 96, 1, [32, 64]),            # a rank half as fast gets a third
    ([1, 2], 100, 1, [33, 67]),           # quotas 33.33 / 66.67: the larger remainder takes the spare sample
    ([1, 1, 1], 10, 1, [4, 3, 3]),        # equal remainders: the lowest rank first
    ([3, 1, 1, 1], 12, 1, [6, 2, 2, 2]),
    ([1, 9], 100, 20, [20, 80]),          # the slow rank's 10 rises to the minimum, the rest goes to the other
    ([1, 100, 100], 30, 5, [5, 13, 12]),  # 25 left for two equal ranks: 12.5 each, the tie to the lower rank
    ([5.0], 7, 1, [7]),
    ([1, 1000], 4, 2, [2, 2]),            # the minimum takes every sample
    ([1, 1000], 10, 0, [0, 10]),          # a minimum of 0 lets the slow rank go without samples
])
def test_sizes_match_hand_computed_cases(speeds, global_batch, minimum, expected):
    assert balanced_sizes(speeds, global_batch, minimum) == expected


def exact_quotas(speeds, global_batch, minimum):
    """An independent water-filling: raise the ranks below the minimum to it one at a time,
    slowest first, sharing what is left among the others by speed."""
    free = sorted(range(len(speeds)), key=lambda rank: speeds[rank])
    quotas = {}
    left = Fraction(global_batch)
    while free:
        total = sum(Fraction(speeds[rank]) for rank in free)
        slowest = free[0]
        if left * Fraction(speeds[slowest]) / total >= minimum:
            quotas.update({rank: left * Fraction(speeds[rank]) / total for rank in free})
            break
        quotas[slowest] = Fraction(minimum)
        left -= minimum
        free.pop(0)
    return [quotas[rank] for rank in range(len(speeds))]


@pytest.mark.parametrize("seed", range(200))
def test_sizes_sum_exactly_keep_the_minimum_and_stay_within_one_of_their_share(seed):
    rng = random.Random(seed)
    ranks = rng.randint(1, 9)
    minimum = rng.randint(0, 8)
    global_batch = rng.randint(max(1, ranks * minimum), ranks * minimum + 500)
    speeds = [rng.choice([rng.uniform(0.01, 1.0), rng.uniform(1.0, 1000.0)]) for _ in range(ranks)]
    sizes = balanced_sizes(speeds, global_batch, minimum)
    assert sum(sizes) == global_batch
    assert min(sizes) >= minimum
    assert all(isinstance(size, int) for size in sizes)
    for size, quota in zip(sizes, exact_quotas(speeds, global_batch, minimum)):
        assert abs(size - quota) < 1, (speeds, global_batch, minimum, sizes)
    # The same speeds give the same sizes, whatever order the calls come in.
    assert balanced_sizes(list(speeds), global_batch, minimum) == sizes


def test_a_global_batch_too_small_for_the_minimum_names_the_numbers():
    with pytest.raises(ValueError, match=r"global batch of 5 samples cannot give each of 3 ranks at least 2 "
                                         r"\(that needs 6\)"):
        balanced_sizes([1, 1, 1], 5, 2)


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan"), float("inf")])
def test_a_speed_that_is_not_positive_and_finite_names_the_rank(speed):
    with pytest.raises(ValueError, match=f"rank 1 has speed {speed}"):
        balanced_sizes([1.0, speed, 1.0], 30)


def test_hysteresis_keeps_the_sizes_under_small_noise():
    rng = random.Random(7)
    sizes = balanced_sizes([1.0, 1.0, 1.0, 1.0], 256)
    moved = 0
    for _ in range(500):
        noisy = [1.0 + rng.uniform(-0.05, 0.05) for _ in range(4)]
        proposed = balanced_sizes(noisy, 256)
        moved += proposed != sizes
        assert not moves_enough(sizes, proposed, 0.1), proposed
    assert moved > 400  # noise moves the exact proposal nearly every time, never past the 10 % hysteresis


def test_hysteresis_moves_the_sizes_under_a_twofold_slowdown():
    sizes = balanced_sizes([1.0, 1.0], 96)
    proposed = balanced_sizes([0.5, 1.0], 96)
    assert proposed == [32, 64]
    assert moves_enough(sizes, proposed, 0.1)


def test_hysteresis_counts_each_ranks_change_against_its_own_size():
    assert not moves_enough([10, 90], [11, 89], 0.1)  # 10 % of 10 is 1: not more than it
    assert moves_enough([10, 90], [12, 88], 0.1)      # 2 samples is 20 % of the small rank
    assert moves_enough([10, 90], [11, 89], 0.0)      # with no hysteresis any change moves
    assert not moves_enough([10, 90], [10, 90], 0.0)
    assert moves_enough([50, 50], [34, 33, 33], 0.5)  # the job changed size
    assert moves_enough([50, 50], [60, 60], 0.5)      # the global batch changed
    with pytest.raises(ValueError, match="0 or more"):
        moves_enough([1], [1], -0.1)


def test_departures_name_ranks_far_from_the_median():
    assert departures([100.0, 100.0, 50.0, 130.0], 0.2) == [(2, 50.0, 0.5), (3, 130.0, 1.3)]
    assert departures([100.0, 110.0, 95.0], 0.2) == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_weighted_buffer_and_result_give_the_mean_over_every_sample(dtype):
    """Three ranks' buffers summed as the Sum all-reduce sums them give the mean over the
    union of their batches, where each rank's array is the mean of its own batch."""
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((count, 4)) for count in (5, 17, 42)]
    summed = sum(weighted_buffer(batch.mean(axis=0).astype(dtype), len(batch), "g", rank, 3)
                 for rank, batch in enumerate(batches))
    result = weighted_result((4,), np.dtype(dtype), "g", 3)(summed)
    assert result.dtype == dtype
    tolerance = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-14}[dtype]
    np.testing.assert_allclose(result, np.concatenate(batches).mean(axis=0), rtol=tolerance, atol=tolerance)


def test_the_weighted_result_writes_into_output_and_scales():
    summed = np.array([6.0, 12.0, 1.0, 2.0])  # two ranks, weights 1 and 2, one value of 2 elements each
    output = np.empty(2)
    assert weighted_result((2,), np.dtype(np.float64), "g", 2, scale=0.5, output=output)(summed) is output
    np.testing.assert_array_equal(output, [1.0, 2.0])


def test_weights_that_sum_to_zero_name_the_tensor_and_every_weight():
    summed = np.zeros(3 + 2)
    with pytest.raises(ValueError, match=r"allreduce 'grad/w': the weights of a weighted average sum to 0 "
                                         r"\(rank 0 had 0, rank 1 had 0\)"):
        weighted_result((3,), np.dtype(np.float64), "grad/w", 2)(summed)


@pytest.mark.parametrize("weight, error, message", [
    (-1, ValueError, r"rank 2 gave weight -1.0; a weight must be a finite number of 0 or more"),
    (float("nan"), ValueError, "rank 2 gave weight nan"),
    ([1, 2], TypeError, r"rank 2 gave weight \[1, 2\], which is no single number"),
])
def test_a_bad_weight_names_the_tensor_and_the_rank(weight, error, message):
    with pytest.raises(error, match=f"allreduce 'loss': {message}"):
        weighted_buffer(np.ones(3), weight, "loss", 2, 3)


def test_a_weighted_average_needs_a_floating_tensor():
    with pytest.raises(TypeError, match="allreduce 'count': a weighted average needs a floating tensor, got dtype "
                                        "int64"):
        weighted_buffer(np.ones(3, dtype=np.int64), 1, "count", 0, 2)


def test_a_half_precision_tensor_is_weighed_in_float32():
    import ml_dtypes

    # In bfloat16, 257 * 1.0 rounds to 256, and in float16 2 * 70000 overflows: weighed after
    # widening, neither happens.
    assert weighted_buffer(np.ones(2, dtype=ml_dtypes.bfloat16), 257, "g", 0, 2).tolist() == [257, 257, 257, 0]
    assert weighted_buffer(np.full(2, 2.0, dtype=np.float16), 70000, "g", 1, 2).tolist() == [140000, 140000, 0, 70000]
