"""Tensor parallelism (hvdplus.torch.parallel): a column- then row-parallel MLP block over
the job's ranks equals the unsplit block, outputs and gradients alike."""

import pytest

torch = pytest.importorskip("torch")

from hvdplus.torch.parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402

FEATURES, HIDDEN, OUT = 6, 12, 4  # 12 splits over 1, 2, 3 and 4 ranks


def whole_block(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, HIDDEN, dtype=torch.float64), torch.nn.Linear(HIDDEN, OUT, dtype=torch.float64)


def test_tensor_parallel_mlp_equals_the_unsplit_one(rank, size):
    fc1, fc2 = whole_block()
    x = torch.randn(5, FEATURES, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(1))
    expected = fc2(torch.tanh(fc1(x)))
    expected.square().sum().backward()

    column, row = ColumnParallelLinear.from_linear(fc1), RowParallelLinear.from_linear(fc2)
    split_x = x.detach().clone().requires_grad_()
    out = row(torch.tanh(column(split_x)))
    out.square().sum().backward()

    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(split_x.grad, x.grad)
    torch.testing.assert_close(column.local.weight.grad, fc1.weight.grad.chunk(size)[rank])
    torch.testing.assert_close(column.local.bias.grad, fc1.bias.grad.chunk(size)[rank])
    torch.testing.assert_close(row.local.weight.grad, fc2.weight.grad.chunk(size, dim=1)[rank])
    torch.testing.assert_close(row.bias.grad, fc2.bias.grad)


def test_gathered_columns_and_whole_input_rows(rank, size):
    fc1, fc2 = whole_block(seed=3)
    x = torch.randn(3, FEATURES, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    gathered = ColumnParallelLinear.from_linear(fc1, gather_output=True)(x)
    torch.testing.assert_close(gathered, fc1(x))
    whole_input = RowParallelLinear.from_linear(fc2, input_is_parallel=False)
    torch.testing.assert_close(whole_input(gathered), fc2(fc1(x)))


def test_features_that_do_not_split_evenly_are_refused(size):
    if size == 1:
        pytest.skip("everything splits over one rank")
    with pytest.raises(ValueError, match="do not split evenly"):
        ColumnParallelLinear(4, size * 2 + 1)
