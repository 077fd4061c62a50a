"""Compression.int8, .topk and .powersgd on real ranks, each against a numpy reference: the
exact cases (PowerSGD at full rank, top-k at ratio 1, int8 on its grid), the error feedback's
bound over 50 steps, int8 sums that no rank count overflows, the error feedback in the
optimizer's state (state_dict, broadcast_optimizer_state), bad input, and digits trained to
within a point of uncompressed accuracy. tests/test_compression.py runs this file at 2 and 3
ranks, and its int8 sums at 4."""

import copy
import time
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STEPS = 50


def rank_array(rank, step, shape, seed=0):
    """Rank `rank`'s array at `step`: every rank can make every rank's, for the references."""
    return np.random.default_rng([seed, rank, step]).standard_normal(shape)


def every_rank(size, step, shape, seed=0):
    return np.stack([rank_array(r, step, shape, seed) for r in range(size)])


def gradient_run(compression, size, rank, shape, steps, seed=0, **optimizer_args):
    """Train W (float64) with SGD at lr 1 on gradients set by hand (rank_array): returns the
    sum of the applied updates, W0 - W_T, and the optimizer."""
    weight = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), named_parameters=[("w", weight)],
                                         compression=compression, **optimizer_args)
    for step in range(steps):
        optimizer.zero_grad()
        (weight * torch.from_numpy(rank_array(rank, step, shape, seed))).sum().backward()
        optimizer.step()
    return -weight.detach().numpy(), optimizer


def true_sum(size, shape, steps, seed=0):
    return sum(every_rank(size, step, shape, seed).mean(axis=0) for step in range(steps))


# -- exact cases ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 4), (4, 7), (3, 2, 5)])
def test_powersgd_at_full_rank_is_the_exact_average(rank, size, shape):
    matrix_rank = min(shape[0], int(np.prod(shape[1:])))
    compression = hvd.Compression.powersgd(rank=matrix_rank, warmup_steps=0, min_compression_rate=1e-9)
    hvd.reset_communication_stats()
    mine = torch.from_numpy(rank_array(rank, 0, shape, seed=1)).float()
    reduced = hvd.allreduce(mine, name=f"full_rank.{shape}", compression=compression)
    np.testing.assert_allclose(reduced.numpy(), every_rank(size, 0, shape, seed=1).mean(axis=0), rtol=1e-5,
                               atol=1e-6)
    # It went as P and Q, (n + m) r numbers, not as the matrix.
    n, m = shape[0], int(np.prod(shape[1:]))
    assert hvd.communication_stats()["total"]["powersgd"]["bytes_after"] == (n + m) * matrix_rank * 4


def test_powersgd_below_full_rank_is_not_exact(rank, size):
    compression = hvd.Compression.powersgd(rank=1, warmup_steps=0)
    reduced = hvd.allreduce(torch.from_numpy(rank_array(rank, 0, (8, 8), seed=2)), name="rank_one",
                            compression=compression)
    assert not np.allclose(reduced.numpy(), every_rank(size, 0, (8, 8), seed=2).mean(axis=0), rtol=1e-2)


def test_top_k_of_everything_is_the_exact_sum_with_accumulation_and_sets(rank, size, even_and_odd_sets):
    own_set, _ = even_and_odd_sets
    members = own_set.ranks
    weight = torch.nn.Parameter(torch.zeros(5, 3, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), named_parameters=[("w", weight)],
                                         compression=hvd.Compression.topk(1.0), backward_passes_per_step=2,
                                         op=hvd.Sum, process_set=own_set)
    optimizer.zero_grad()
    for step in range(2):
        (weight * torch.from_numpy(rank_array(rank, step, (5, 3), seed=3))).sum().backward()
    optimizer.step()
    expected = sum(rank_array(r, step, (5, 3), seed=3) for r in members for step in range(2))
    np.testing.assert_allclose(-weight.detach().numpy(), expected, rtol=1e-12)


def test_int8_on_its_grid_is_exact(rank, size):
    # Every value a multiple of chunk max / 127, and the max in every chunk: nothing to round.
    units = np.random.default_rng([4, rank]).integers(-127, 128, size=3000)
    units[::1024] = 127
    mine = torch.from_numpy(units * 0.5)
    reduced = hvd.allreduce(mine, name="on_grid", compression=hvd.Compression.int8, op=hvd.Sum)
    every = sum(np.random.default_rng([4, r]).integers(-127, 128, size=3000) for r in range(size))
    every[::1024] = 127 * size
    np.testing.assert_array_equal(reduced.numpy(), every * 0.5)


# -- int8 does not overflow ----------------------------------------------------------------
def test_int8_sums_of_large_values_do_not_overflow(rank, size):
    # Chunk 0 holds 1e30 on every rank, chunk 1 values at float32's largest (whose float32 sum
    # overflows), chunk 2 each chunk's max on every rank: 127 * size, past int8's range.
    values = np.zeros(3 * 1024, dtype=np.float32)
    values[:1024] = 1e30
    values[1024:2048] = np.float32(3.0e38) * (1 if rank % 2 == 0 else 0.999)
    values[2048:] = np.linspace(-1, 1, 1024, dtype=np.float32) * (rank + 1)
    values[2048] = size  # the chunk's max, on every rank
    for op in (hvd.Average, hvd.Sum):
        if op == hvd.Sum:
            values[1024:2048] = 0  # a sum past float32's largest is inf however it is made
        reduced = hvd.allreduce(torch.from_numpy(values), name=f"large.{op}", compression=hvd.Compression.int8,
                                op=op).numpy().astype(np.float64)
        every = np.stack([np.float64(1e30) * np.ones(1024) for _ in range(size)])
        expected = every.sum(axis=0) / (size if op == hvd.Average else 1)
        np.testing.assert_allclose(reduced[:1024], expected, rtol=1e-6)
        assert reduced[2048] == pytest.approx(size * size / (size if op == hvd.Average else 1), rel=1e-6)
        if op == hvd.Average:
            assert np.isfinite(reduced[1024:2048]).all()
            big = [3.0e38 * (1 if r % 2 == 0 else 0.999) for r in range(size)]
            np.testing.assert_allclose(reduced[1024:2048], np.mean(big), rtol=1 / 127)


# -- error feedback: the applied updates track the true ones --------------------------------
def telescoped_residual(optimizer, weight_shape):
    """Minus the ranks' mean error feedback after the last step, gathered from their states:
    the sum of the applied updates minus the true sum, exactly (see docs/compression.md)."""
    (state,) = optimizer.state.values()
    errors = hvd.allgather(state["compression_error"].reshape(1, -1).clone(), name="residuals")
    return -errors.numpy().mean(axis=0).reshape(weight_shape)


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_int8_error_feedback_tracks_the_true_sum(rank, size, stochastic):
    shape = (40, 60)
    applied, optimizer = gradient_run(hvd.Compression.int8(stochastic=stochastic, seed=rank), size, rank, shape,
                                      STEPS, seed=5)
    deviation = applied - true_sum(size, shape, STEPS, seed=5)
    largest_gradient = max(np.abs(every_rank(size, step, shape, seed=5)).max() for step in range(STEPS))
    bound = largest_gradient / (126 if stochastic else 253)
    assert np.abs(deviation).max() <= bound
    np.testing.assert_allclose(deviation, telescoped_residual(optimizer, shape), atol=1e-12)


def test_top_k_error_feedback_tracks_the_true_sum(rank, size):
    shape, ratio = (30, 20), 0.1
    applied, optimizer = gradient_run(hvd.Compression.topk(ratio), size, rank, shape, STEPS, seed=6)
    deviation = applied - true_sum(size, shape, STEPS, seed=6)
    contraction = np.sqrt(1 - np.ceil(ratio * 600) / 600)
    largest_norm = max(np.linalg.norm(g) for step in range(STEPS) for g in every_rank(size, step, shape, seed=6))
    assert np.linalg.norm(deviation) <= contraction / (1 - contraction) * largest_norm
    np.testing.assert_allclose(deviation, telescoped_residual(optimizer, shape), atol=1e-12)
    # Without error feedback the unsent 90 % of every step would be lost: most of the sum.
    assert np.linalg.norm(deviation) < 0.5 * np.linalg.norm(true_sum(size, shape, STEPS, seed=6))


def powersgd_replay(size, shape, rank, steps, seed, warmup_steps, error_feedback=True):
    """Numpy's PowerSGD over every rank, as Vogels et al. and DDP's hook: the sum of the applied
    averages, and every rank's error feedback after the last step."""
    n, m = shape
    q = np.linalg.qr(np.random.default_rng(zlib.crc32(b"grad.w")).standard_normal((m, rank)))[0]
    errors = np.zeros((size, n, m))
    applied = np.zeros(shape)
    for step in range(steps):
        gradients = every_rank(size, step, shape, seed)
        if step < warmup_steps:
            applied += gradients.mean(axis=0)
            continue
        matrices = gradients + errors if error_feedback else gradients
        p = np.linalg.qr(sum(x @ q for x in matrices))[0]
        q = sum(x.T @ p for x in matrices)
        average = p @ q.T / size
        errors = matrices - average
        applied += average
    return applied, errors


def test_powersgd_error_feedback_tracks_the_true_sum(rank, size):
    shape, warmup = (16, 12), 3
    applied, optimizer = gradient_run(hvd.Compression.powersgd(rank=2, warmup_steps=warmup), size, rank, shape,
                                      STEPS, seed=7)
    replayed, errors = powersgd_replay(size, shape, 2, STEPS, 7, warmup)
    np.testing.assert_allclose(applied, replayed, rtol=1e-5, atol=1e-8)
    truth = true_sum(size, shape, STEPS, seed=7)
    deviation = applied - truth
    np.testing.assert_allclose(deviation, -errors.mean(axis=0), atol=1e-9)
    # The bound: what the last step's projection left out of its compensated average.
    last = every_rank(size, STEPS - 1, shape, seed=7).mean(axis=0) - deviation_before_last(size, shape, warmup)
    assert np.linalg.norm(deviation) <= np.linalg.norm(last) * (1 + 1e-9)
    # Without error feedback the same compression drifts several times further.
    drifted, _ = powersgd_replay(size, shape, 2, STEPS, 7, warmup, error_feedback=False)
    assert np.linalg.norm(deviation) < 0.5 * np.linalg.norm(drifted - truth)


def deviation_before_last(size, shape, warmup):
    replayed, _ = powersgd_replay(size, shape, 2, STEPS - 1, 7, warmup)
    return replayed - true_sum(size, shape, STEPS - 1, seed=7)


# -- the error feedback lives in the optimizer's state --------------------------------------
COMPRESSIONS = {
    "int8": lambda: hvd.Compression.int8,
    "topk": lambda: hvd.Compression.topk(0.2),
    "powersgd": lambda: hvd.Compression.powersgd(rank=1, warmup_steps=2, min_compression_rate=1),
}


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)).double()


def train_steps(model, optimizer, rank, steps):
    for step in steps:
        x = torch.from_numpy(rank_array(rank, step, (4, 8), seed=8))
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def wrapped_adam(model, name):
    return hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.05),
                                    named_parameters=model.named_parameters(), compression=COMPRESSIONS[name]())


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_a_run_resumed_from_state_dict_equals_an_uninterrupted_one(rank, name):
    whole = small_model()
    train_steps(whole, wrapped_adam(whole, name), rank, range(8))
    first = small_model()
    optimizer = wrapped_adam(first, name)
    train_steps(first, optimizer, rank, range(4))
    saved = copy.deepcopy(optimizer.state_dict())  # as a checkpoint holds it, apart from the live state
    assert any("compression_error" in state for state in saved["state"].values())
    for resumed_state, expect_equal in ((saved, True), (_without_error_feedback(saved), False)):
        resumed = small_model()
        resumed.load_state_dict(first.state_dict())
        optimizer = wrapped_adam(resumed, name)
        optimizer.load_state_dict(resumed_state)
        train_steps(resumed, optimizer, rank, range(4, 8))
        same = all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))
        assert same == expect_equal


def _without_error_feedback(saved):
    state = {key: {k: v for k, v in entry.items() if k != "compression_error"} for key, entry in saved["state"].items()}
    return {"state": state, "param_groups": saved["param_groups"]}


def test_broadcast_optimizer_state_carries_the_error_feedback(rank):
    model = small_model()
    optimizer = wrapped_adam(model, "topk")
    train_steps(model, optimizer, rank, range(2))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    errors = torch.cat([state["compression_error"].reshape(-1) for state in optimizer.state.values()])
    gathered = hvd.allgather(errors.reshape(1, -1), name="broadcast_errors")
    np.testing.assert_array_equal(gathered.numpy(), np.repeat(gathered.numpy()[:1], len(gathered), axis=0))


# -- bytes ---------------------------------------------------------------------------------
def test_communication_stats_count_each_compression(rank, size):
    shape = (64, 32)
    hvd.reset_communication_stats()
    gradient_run(hvd.Compression.int8, size, rank, shape, 1)
    gradient_run(hvd.Compression.topk(0.01), size, rank, shape, 1)
    gradient_run(hvd.Compression.powersgd(rank=4, warmup_steps=0), size, rank, shape, 1)
    gradient_run(hvd.Compression.none, size, rank, shape, 1)
    stats = hvd.communication_stats()["total"]
    before = 64 * 32 * 8
    assert {label: stats[label]["bytes_before"] for label in stats} == dict.fromkeys(stats, before)
    # Two chunks' maxima as float64, then the int8 values gathered, or all-reduced as int16.
    expected = {"allreduce": 16, "allgather": 2048} if size < 4 else {"allreduce": 16 + 2048 * 2}
    assert stats["int8"]["by_collective"] == expected
    assert stats["topk"]["bytes_after"] == 21 * (4 + 8)
    assert stats["powersgd"]["bytes_after"] == (64 + 32) * 4 * 8
    assert stats["none"]["bytes_after"] == before


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("make, words", [
    (lambda: hvd.Compression.topk(0), "ratio must be a number in (0, 1]"),
    (lambda: hvd.Compression.topk(1.5), "ratio must be a number in (0, 1]"),
    (lambda: hvd.Compression.powersgd(rank=0), "rank must be an integer of 1 or more"),
    (lambda: hvd.Compression.powersgd(rank=2, warmup_steps=-1), "warmup_steps"),
])
def test_bad_settings_raise_value_error(make, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        make()


def test_int8_of_an_integer_tensor_names_it():
    with pytest.raises(ValueError, match="'counts' is torch.int64; it compresses floating-point tensors only"):
        hvd.allreduce(torch.arange(5), name="counts", compression=hvd.Compression.int8)


def test_lossy_compression_refuses_other_ops_and_weights():
    model = small_model()
    with pytest.raises(ValueError, match="takes op Average or Sum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.int8,
                                 op=hvd.Adasum)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=hvd.Compression.int8)
    with pytest.raises(ValueError, match="does not weight gradients"):
        optimizer.set_local_samples(3)


def test_ranks_that_compress_differently_raise_on_every_rank(rank, size):
    model = small_model()
    compression = hvd.Compression.int8 if rank == 0 else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), compression=compression)
    with pytest.raises(ValueError, match=r"the ranks compress differently \(Compression.int8\(stochastic=False\) "
                                         r"on ranks \[0\]; none on ranks \[1"):
        optimizer.synchronize()


# -- digits ---------------------------------------------------------------------------------
DIGIT_COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "int8": lambda: hvd.Compression.int8,
    "int8-stochastic": lambda: hvd.Compression.int8(stochastic=True, seed=hvd.rank()),
    "topk-10%": lambda: hvd.Compression.topk(0.1),
    "powersgd-rank-4": lambda: hvd.Compression.powersgd(rank=4, warmup_steps=10),
}


def digits_accuracy(compression, rank, size):
    """Test accuracy of a 64-32-10 MLP after 150 Adam steps on this rank's share of digits, and
    the bytes its last step handed to collectives."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    mine = train[rank::size]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), compression=compression)
    hvd.reset_communication_stats()
    for step in range(150):
        batch = mine[(step * 64) % len(mine):][:64]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(dim=1) == y[test]).float().mean().item() * 100
    (sent,) = hvd.communication_stats()["last_step"].values()
    return accuracy, sent["bytes_after"]


def test_digits_with_each_compression_within_a_point_of_uncompressed(rank, size):
    started = time.perf_counter()
    accuracy, sent = {}, {}
    for name, make in DIGIT_COMPRESSIONS.items():
        accuracy[name], sent[name] = digits_accuracy(make(), rank, size)
    print(f"digits at {size} ranks in {time.perf_counter() - started:.1f} s: test accuracy (%) {accuracy}, "
          f"bytes per step {sent}")
    assert accuracy["none"] > 90
    for name, value in accuracy.items():
        assert value >= accuracy["none"] - 1, (name, accuracy)


def test_an_allreduce_compressed_on_one_rank_only_raises_on_every_rank(rank):
    tensor = torch.ones(300)
    compression = hvd.Compression.int8 if rank == 0 else hvd.Compression.none
    words = "every rank must use the same compression" if rank == 0 else "Mismatched"
    with pytest.raises(ValueError, match=words):
        hvd.allreduce(tensor, name="compressed_on_rank_0", compression=compression)
