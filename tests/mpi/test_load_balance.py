"""The load balancer and the weighted average on real ranks: every rank agrees on the sizes, a
rank reporting half the speed gets its share, the weighted all-reduce of uneven batches equals
the mean over their union, and bad weights raise on every rank."""

import json
import logging
import re

import numpy as np
import pytest

import hvdplus as hvd

GLOBAL_BATCH = 120
COUNTS = (5, 17, 42)  # uneven batches, one per rank (round robin beyond three ranks)


@pytest.fixture(autouse=True)
def job_still_works_afterwards(size):
    yield
    np.testing.assert_array_equal(hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, size))


def everyones(value):
    return hvd.allgather_object(value)


def feed(balancer, seconds_per_sample, steps):
    """`steps` steps of recorded compute at `seconds_per_sample`, each followed by a rebalance;
    the sizes after each step."""
    history = []
    for _ in range(steps):
        samples = balancer.local_batch_size()
        balancer.record(samples, samples * seconds_per_sample)
        history.append(balancer.rebalance())
    return history


def slow_last(rank, size, slowdown=2.0):
    return 0.001 * (slowdown if rank == size - 1 and size > 1 else 1.0)


def test_sizes_start_even_and_every_rank_agrees_on_them(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0)
    assert sum(balancer.sizes()) == GLOBAL_BATCH and max(balancer.sizes()) - min(balancer.sizes()) <= 1
    # Speeds that differ on every rank, in a ratio no float rounds evenly.
    feed(balancer, 0.001 * (1 + rank / 7), 3)
    sizes = balancer.sizes()
    assert everyones(sizes) == [sizes] * size
    assert sum(sizes) == GLOBAL_BATCH
    assert sizes[rank] == balancer.local_batch_size()
    if size > 1:
        assert sizes == sorted(sizes, reverse=True)  # slower ranks never get more
    speeds = balancer.speeds()
    np.testing.assert_allclose(speeds, [1000 / (1 + r / 7) for r in range(size)], rtol=1e-12)


def test_a_rank_half_as_fast_gets_half_the_share_of_the_others(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0)
    feed(balancer, slow_last(rank, size), 1)
    # Shares of speeds 1, ..., 1, 0.5: at 2 ranks 80 and 40 (a third), at 3 ranks 48, 48, 24.
    expected = {1: [120], 2: [80, 40], 3: [48, 48, 24], 4: [35, 34, 34, 17]}[size]
    assert balancer.sizes() == expected


def test_it_adapts_when_a_rank_slows_down_and_when_it_recovers(rank, size):
    if size < 2:
        pytest.skip("a slowdown of one rank against the others needs two ranks")
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, smoothing=0.3, hysteresis=0.1, warmup_steps=0)
    even = balancer.sizes()
    assert feed(balancer, 0.001, 3)[-1] == even
    slow_share = GLOBAL_BATCH * 0.5 / (size - 0.5)
    history = feed(balancer, slow_last(rank, size), 10)
    assert all(sum(sizes) == GLOBAL_BATCH for sizes in history)
    # Within ten steps the slow rank's share is its exact one, give or take the 10 % hysteresis.
    assert abs(history[-1][-1] - slow_share) <= 0.1 * slow_share + 1, history
    history = feed(balancer, 0.001, 10)
    assert abs(history[-1][-1] - GLOBAL_BATCH / size) <= 0.1 * GLOBAL_BATCH / size + 1, history
    assert everyones(history) == [history] * size


def test_sizes_stay_until_every_rank_has_measured(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0)
    even = balancer.sizes()
    if rank == 0:
        balancer.record(10, 0.5)
    assert balancer.rebalance() == even
    if size > 1:
        assert balancer.speeds() is None
    else:
        assert balancer.speeds() == [20.0]


def test_the_first_step_after_the_start_and_each_reset_is_left_out(rank, size):
    # By default one step warms up: its one-time costs (here 50 times a step's, on one rank
    # only) would otherwise hold the sizes back for many steps.
    balancer = hvd.LoadBalancer(GLOBAL_BATCH)
    even = balancer.sizes()
    for _ in range(2):
        balancer.record(balancer.local_batch_size(), 50.0 if rank == 0 else 1.0)
        assert balancer.rebalance() == even and balancer.speeds() is None
        feed(balancer, 0.001, 1)  # every rank alike from here on
        assert balancer.rebalance() == even and balancer.speeds() == pytest.approx([1000.0] * size)
        balancer.reset()
    with pytest.raises(ValueError, match="warmup_steps must be 0 or more, got -1"):
        hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=-1)


def test_the_slices_of_a_global_batch_cover_it_once_in_rank_order(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0)
    feed(balancer, 0.001 * (1 + rank), 1)
    indices = np.random.default_rng(0).permutation(1000)[:GLOBAL_BATCH]  # the same on every rank
    mine = balancer.slice(indices)
    assert len(mine) == balancer.local_batch_size()
    np.testing.assert_array_equal(np.concatenate(everyones(mine)), indices)
    with pytest.raises(ValueError, match=f"got {GLOBAL_BATCH + 1} indices for a global batch of {GLOBAL_BATCH}"):
        balancer.slice(range(GLOBAL_BATCH + 1))


@pytest.mark.parametrize("count", [0, 1, 2, 7, GLOBAL_BATCH - 1])
def test_a_short_last_batch_is_split_in_the_same_proportions(rank, size, count):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, min_batch_size=0, warmup_steps=0)
    feed(balancer, 0.001 * (1 + 3 * rank), 1)
    if size == 3:
        feed(balancer, 0.001 * 1000 if rank == 2 else 0.001, 1)  # and one rank without a share
        assert balancer.sizes()[2] == 0
    indices = np.arange(1000, 1000 + count)
    shares = everyones(list(balancer.slice(indices)))
    assert sum(shares, []) == list(indices)
    for share, size_of_full in zip(shares, balancer.sizes()):
        assert abs(len(share) - count * size_of_full / GLOBAL_BATCH) < 1, (shares, balancer.sizes())


@pytest.mark.skipif(hvd.size() < 2, reason="ranks that differ need two ranks")
@pytest.mark.parametrize("setting, values", [("global_batch_size", (GLOBAL_BATCH, GLOBAL_BATCH + 6)),
                                             ("min_batch_size", (1, 2)), ("hysteresis", (0.1, 0.25))])
def test_balancers_whose_settings_differ_raise_on_every_rank_naming_them(rank, size, setting, values):
    mine = values[1] if rank == size - 1 else values[0]
    balancer = hvd.LoadBalancer(**{"global_batch_size": GLOBAL_BATCH, setting: mine, "warmup_steps": 0})
    balancer.record(10, 0.01)
    listed = ", ".join(f"rank {r} has {values[1] if r == size - 1 else values[0]:g}" for r in range(size))
    with pytest.raises(ValueError, match=re.escape(f"the ranks' balancers differ in {setting}: {listed}")):
        balancer.rebalance()


def test_reset_forgets_the_measurements_and_splits_evenly(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, min_batch_size=3, warmup_steps=0)
    feed(balancer, slow_last(rank, size, slowdown=5.0), 2)
    balancer.reset()
    assert balancer.speeds() is None
    assert balancer.sizes() == hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0).sizes()
    assert max(balancer.sizes()) - min(balancer.sizes()) <= 1


def test_the_minimum_holds_for_a_very_slow_rank(rank, size):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, min_batch_size=10, warmup_steps=0)
    feed(balancer, slow_last(rank, size, slowdown=1000.0), 1)
    if size > 1:
        assert balancer.sizes()[-1] == 10
        assert sum(balancer.sizes()) == GLOBAL_BATCH


def test_a_global_batch_too_small_raises_on_every_rank(size):
    with pytest.raises(ValueError, match=f"global batch of {size} samples cannot give each of {size} ranks "
                                         "at least 2"):
        hvd.LoadBalancer(size, min_batch_size=2, warmup_steps=0)


def test_rank_zero_reports_departing_ranks_at_most_once_a_minute(rank, size, caplog):
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, report_threshold=0.2, warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="hvdplus.load_balance"):
        feed(balancer, slow_last(rank, size), 3)
    lines = [record.getMessage() for record in caplog.records if record.name == "hvdplus.load_balance"]
    if rank == 0 and size > 1:
        assert len(lines) == 1, lines
        assert f"rank {size - 1} at 500 samples/s" in lines[0]
        if size > 2:  # at two ranks the median lies between them, and both depart from it
            assert f"rank {size - 1} at 500 samples/s (0.50x)" in lines[0] and "rank 0 at" not in lines[0]
    else:
        assert lines == []


def test_the_timeline_holds_each_ranks_compute_time_and_batch_size_per_step(rank, size, tmp_path):
    path = hvd.broadcast_object(str(tmp_path / "timeline.json"), root_rank=0)  # rank 0 writes it
    balancer = hvd.LoadBalancer(GLOBAL_BATCH, warmup_steps=0)
    hvd.start_timeline(path)
    steps = []
    for step in range(3):
        samples = balancer.local_batch_size()
        seconds = samples * slow_last(rank, size) * (step + 1)  # each step slower than the last
        balancer.record(samples, seconds)
        steps.append((everyones(seconds), balancer.rebalance()))
    hvd.stop_timeline()
    if rank != 0:
        return
    with open(path) as trace:
        events = [event for event in json.load(trace) if event.get("ph") == "C"]
    series = {name: [event["args"] for event in events if event["name"] == name]
              for name in ("load_balance.compute_seconds", "load_balance.local_batch_size")}
    ranks = [f"rank {r}" for r in range(size)]
    assert series["load_balance.compute_seconds"] == [dict(zip(ranks, seconds)) for seconds, _ in steps]
    assert series["load_balance.local_batch_size"] == [dict(zip(ranks, sizes)) for _, sizes in steps]


@pytest.mark.skipif(hvd.size() < 2, reason="process sets other than the job's need two ranks")
def test_a_balancer_on_a_process_set_balances_its_own_ranks(rank, size, even_and_odd_sets):
    mine, _ = even_and_odd_sets
    balancer = hvd.LoadBalancer(60, process_set=mine, warmup_steps=0)
    feed(balancer, 0.001 * (2.0 if mine.rank() == mine.size() - 1 and mine.size() > 1 else 1.0), 1)
    expected = {1: [60], 2: [40, 20]}[mine.size()]
    assert balancer.sizes() == expected
    assert balancer.local_batch_size() == expected[mine.rank()]


def uneven_batches(size, dtype, features=6):
    """Every rank's batch (the same on every rank, from one seed) and their union."""
    rng = np.random.default_rng(11)
    batches = [rng.standard_normal((COUNTS[r % len(COUNTS)], features)).astype(dtype) for r in range(size)]
    return batches, np.concatenate(batches).astype(np.float64)


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-6), (np.float64, 1e-13), (np.float16, 2e-3)])
def test_the_weighted_average_of_uneven_batches_is_the_mean_over_their_union(rank, size, dtype, tolerance):
    batches, union = uneven_batches(size, dtype)
    local_mean = batches[rank].astype(np.float64).mean(axis=0).astype(dtype)
    result = hvd.allreduce(local_mean, op=hvd.Average, weight=len(batches[rank]), name=f"mean.{np.dtype(dtype)}")
    assert result.dtype == dtype and result.shape == local_mean.shape
    np.testing.assert_allclose(result.astype(np.float64), union.mean(axis=0), rtol=tolerance, atol=tolerance)


def test_the_weighted_average_writes_into_output_and_applies_the_scale_factors(rank, size):
    batches, union = uneven_batches(size, np.float64)
    local_sum = batches[rank].sum(axis=0)
    output = np.empty_like(local_sum)
    # Each rank's per-sample mean, weighted by its count: the sum over all samples, divided by the total.
    handle = hvd.allreduce_async(local_sum / len(batches[rank]), op=hvd.Average, output=output,
                                 prescale_factor=2.0, postscale_factor=0.25, weight=len(batches[rank]))
    assert hvd.synchronize(handle) is output
    np.testing.assert_allclose(output, 0.5 * union.mean(axis=0), rtol=1e-13)


def test_a_zero_weight_leaves_a_rank_out(rank, size):
    if size < 2:
        pytest.skip("leaving one rank out of the average needs two ranks")
    result = hvd.allreduce(np.full(3, float(rank)), weight=0.0 if rank == 0 else 1.0)
    np.testing.assert_allclose(result, np.full(3, np.mean(range(1, size))))


def test_weights_that_sum_to_zero_raise_on_every_rank(size):
    listed = ", ".join(f"rank {r} had 0" for r in range(size))
    with pytest.raises(ValueError, match=rf"allreduce 'grad/empty': the weights of a weighted average sum to 0 "
                                         rf"\({listed}\)"):
        hvd.allreduce(np.ones(4, dtype=np.float32), weight=0, name="grad/empty")


def test_a_negative_weight_on_one_rank_raises_on_every_rank(rank, size):
    bad = size - 1
    with pytest.raises(ValueError, match=rf"rank {bad}: allreduce 'grad/neg': rank {bad} gave weight -3.0"):
        hvd.allreduce(np.ones(2), weight=-3 if rank == bad else 1, name="grad/neg")


def test_a_weight_with_another_op_raises_on_every_rank(rank):
    with pytest.raises(ValueError, match=r"allreduce 'grad/sum': weight= applies to op=Average only, got op=Sum"):
        hvd.allreduce(np.ones(2), op=hvd.Sum, weight=1, name="grad/sum")


def test_a_weighted_average_of_integers_raises_on_every_rank(rank):
    with pytest.raises(TypeError, match="allreduce 'counts': a weighted average needs a floating tensor"):
        hvd.allreduce(np.ones(2, dtype=np.int32), weight=1, name="counts")
