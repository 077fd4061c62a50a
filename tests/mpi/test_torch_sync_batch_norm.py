"""SyncBatchNorm on 1, 2 and 3 ranks against torch's BatchNorm on the whole batch in one process.

Every rank builds the same global batch from a fixed seed, feeds its own (uneven, possibly
empty) block of rows to SyncBatchNorm, and checks its rows of the output and of the input
gradient, the summed parameter gradients and the running statistics against the reference.
"""

import pytest

torch = pytest.importorskip("torch")

import hvdplus.torch as hvd  # noqa: E402
from hvdplus.torch import sync_batch_norm  # noqa: E402

CHANNELS = 3
TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}


def row_bounds(total, size, first_rank_empty):
    """Rank r gets a block growing with r; with first_rank_empty, rank 0 gets none."""
    weights = [0 if first_rank_empty and r == 0 else r + 1 for r in range(size)]
    bounds = [0]
    for r in range(size):
        bounds.append(round(total * sum(weights[:r + 1]) / sum(weights)))
    return bounds


def global_batch(shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(shape, generator=generator, dtype=torch.float64) * 2.0 + 0.5
    loss_weights = torch.randn(shape, generator=generator, dtype=torch.float64)
    return inputs.to(dtype), loss_weights.to(dtype)


def reference_module(dims, **kwargs):
    return {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[dims](CHANNELS, **kwargs)


def make_pair(dims, dtype, **kwargs):
    """A SyncBatchNorm and its reference, with the same non-trivial weight and bias."""
    layer = hvd.SyncBatchNorm(CHANNELS, **kwargs).to(dtype)
    reference = reference_module(dims, **kwargs).to(dtype)
    if layer.affine:
        generator = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for name in ("weight", "bias"):
                values = torch.randn(CHANNELS, generator=generator, dtype=torch.float64).to(dtype)
                getattr(layer, name).copy_(values)
                getattr(reference, name).copy_(values)
    return layer, reference


def run_step(layer, reference, shape, dtype, seed, rank, size, first_rank_empty):
    """One forward + backward on both; asserts this rank's output and input-gradient rows."""
    inputs, loss_weights = global_batch(shape, dtype, seed)
    bounds = row_bounds(shape[0], size, first_rank_empty)
    rows = slice(bounds[rank], bounds[rank + 1])

    local = inputs[rows].clone().requires_grad_()
    output = layer(local)
    (output * loss_weights[rows]).sum().backward()

    whole = inputs.clone().requires_grad_()
    expected = reference(whole)
    (expected * loss_weights).sum().backward()

    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(output, expected[rows].detach(), **tolerance)
    torch.testing.assert_close(local.grad, whole.grad[rows], **tolerance)


def assert_parameter_grads(layer, reference, dtype):
    for name in ("weight", "bias"):
        local_grad = getattr(layer, name).grad
        summed = hvd.allreduce(local_grad, op=hvd.Sum)
        torch.testing.assert_close(summed, getattr(reference, name).grad, **TOLERANCE[dtype])
        getattr(layer, name).grad = None
        getattr(reference, name).grad = None


def assert_running_stats(layer, reference, dtype):
    torch.testing.assert_close(layer.running_mean, reference.running_mean, **TOLERANCE[dtype])
    torch.testing.assert_close(layer.running_var, reference.running_var, **TOLERANCE[dtype])
    assert int(layer.num_batches_tracked) == int(reference.num_batches_tracked)


SHAPES = {"2d": lambda size: (7 * size, CHANNELS), "3d": lambda size: (4 * size + 1, CHANNELS, 5),
          "4d": lambda size: (2 * size + 1, CHANNELS, 3, 4)}
CONFIGS = {
    "default": {},
    "cumulative": dict(momentum=None),
    "no_affine": dict(affine=False),
    "no_running_stats": dict(track_running_stats=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("first_rank_empty", [False, True], ids=["uneven", "rank0_empty"])
def test_matches_batch_norm_on_whole_batch(rank, size, dtype, shape_name, config, first_rank_empty):
    if first_rank_empty and size == 1:
        pytest.skip("the only rank cannot be the empty one")
    kwargs = CONFIGS[config]
    shape = SHAPES[shape_name](size)
    layer, reference = make_pair(len(shape), dtype, **kwargs)

    for step in range(3):
        run_step(layer, reference, shape, dtype, 100 + step, rank, size, first_rank_empty)
        if layer.affine:
            assert_parameter_grads(layer, reference, dtype)
        if layer.track_running_stats:
            assert_running_stats(layer, reference, dtype)

    layer.eval()
    reference.eval()
    with torch.no_grad():
        inputs, _ = global_batch(shape, dtype, 200)
        bounds = row_bounds(shape[0], size, first_rank_empty)
        rows = slice(bounds[rank], bounds[rank + 1])
        torch.testing.assert_close(layer(inputs[rows]), reference(inputs)[rows], **TOLERANCE[dtype])


def test_input_without_grad_still_gives_parameter_grads(rank, size):
    shape = (5 * size, CHANNELS, 2)
    layer, reference = make_pair(3, torch.float32)
    inputs, loss_weights = global_batch(shape, torch.float32, 7)
    rows = slice(5 * rank, 5 * (rank + 1))
    (layer(inputs[rows]) * loss_weights[rows]).sum().backward()
    (reference(inputs) * loss_weights).sum().backward()
    assert_parameter_grads(layer, reference, torch.float32)


def test_single_value_per_channel_fails_on_every_rank(rank, size):
    layer = hvd.SyncBatchNorm(CHANNELS)
    local = torch.ones(1 if rank == 0 else 0, CHANNELS)
    with pytest.raises(ValueError):
        layer(local)


def test_wrong_channel_count_is_refused(size):
    with pytest.raises(ValueError, match=r"\(N, 3, \.\.\.\)"):
        hvd.SyncBatchNorm(CHANNELS)(torch.ones(4, CHANNELS + 1))


def test_function_matches_batch_norm_and_finite_differences(size):
    if size != 1:
        pytest.skip("finite differences perturb one rank's input while the statistics span all ranks")
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(6, CHANNELS, 2, generator=generator, dtype=torch.float64).requires_grad_()
    weight = torch.randn(CHANNELS, generator=generator, dtype=torch.float64).requires_grad_()
    bias = torch.randn(CHANNELS, generator=generator, dtype=torch.float64).requires_grad_()

    def normalized(x, w, b):
        return sync_batch_norm._SyncBatchNormFunction.apply(x, w, b, 1e-5)[0]

    expected = torch.nn.functional.batch_norm(inputs, None, None, weight, bias, training=True, eps=1e-5)
    torch.testing.assert_close(normalized(inputs, weight, bias), expected)
    assert torch.autograd.gradcheck(normalized, (inputs, weight, bias))
