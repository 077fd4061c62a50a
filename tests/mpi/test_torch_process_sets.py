"""hvdplus.torch on process sets: every collective, their gradients, the functions,
DistributedOptimizer and SyncBatchNorm over sets of 1, 2 and 3 ranks, against torch
references; disjoint sets at once; a rank outside a set. Run at 1-3 ranks with the other
suites, and at 4 ranks on its own (tests/test_mpi_suites.py).

Each layout splits the job into disjoint sets; every rank works on the set it belongs to,
so different sets run the same test at the same time. A set of every rank is the global
one, passed explicitly."""

import re

import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.rank_data import rank_values  # noqa: E402

SIZE, RANK = hvd.size(), hvd.rank()


def layouts(size):
    """{name: [ranks of each set]}: each rank alone; evens and odds; the first rank and the
    rest (a set of 3 at 4 ranks); and the whole job. Layouts that repeat one before are left out."""
    everyone = list(range(size))
    found = {"alone": [[r] for r in everyone], "even-odd": [everyone[0::2], everyone[1::2]],
             "first-rest": [[0], everyone[1:]], "job": [everyone]}
    unique, seen = {}, set()
    for name, blocks in found.items():
        key = tuple(tuple(ranks) for ranks in blocks if ranks)
        if key not in seen:
            seen.add(key)
            unique[name] = [list(ranks) for ranks in key]
    return unique


LAYOUTS = layouts(SIZE)
HALVES = LAYOUTS.get("even-odd", LAYOUTS["alone"])  # two disjoint sets that cover the job (at 2 ranks: alone)


@pytest.fixture(scope="module")
def sets():
    """{tuple of job ranks: ProcessSet} for every set of every layout; added and removed on
    every rank in the same order."""
    blocks = list(dict.fromkeys(tuple(ranks) for blocks in LAYOUTS.values() for ranks in blocks))
    added = {ranks: hvd.add_process_set(list(ranks)) for ranks in blocks if len(ranks) < SIZE}
    yield {**added, tuple(range(SIZE)): hvd.global_process_set}
    for process_set in added.values():
        hvd.remove_process_set(process_set)


@pytest.fixture(params=list(LAYOUTS))
def group(request, sets):
    """(this rank's ProcessSet in the layout, its job ranks)."""
    ranks = next(ranks for ranks in LAYOUTS[request.param] if RANK in ranks)
    return sets[tuple(ranks)], ranks


def values(rank, shape, seed, dtype=torch.float32):
    return torch.from_numpy(rank_values("float64", shape, rank, seed)).to(dtype)


def stacked(ranks, shape, seed, dtype=torch.float32):
    return torch.stack([values(r, shape, seed, dtype) for r in ranks]).to(torch.float64)


def assert_close(actual, expected, dtype=torch.float32):
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), rtol=1e-5, atol=1e-5)


# -- the collectives -----------------------------------------------------------------------
ALLREDUCES = {
    "allreduce": lambda t, **kw: hvd.allreduce(t, **kw),
    "allreduce_async": lambda t, **kw: hvd.synchronize(hvd.allreduce_async(t, **kw)),
    "allreduce_": lambda t, **kw: hvd.allreduce_(t, **kw),
    "allreduce_async_": lambda t, **kw: hvd.synchronize(hvd.allreduce_async_(t, **kw)),
    "grouped_allreduce": lambda t, **kw: hvd.grouped_allreduce([t], **kw)[0],
    "grouped_allreduce_async": lambda t, **kw: hvd.synchronize(hvd.grouped_allreduce_async([t], **kw))[0],
    "grouped_allreduce_": lambda t, **kw: hvd.grouped_allreduce_([t], **kw)[0],
    "grouped_allreduce_async_": lambda t, **kw: hvd.synchronize(hvd.grouped_allreduce_async_([t], **kw))[0],
}


@pytest.mark.parametrize("variant", list(ALLREDUCES))
def test_allreduce_variants_average_over_the_set(group, variant):
    process_set, ranks = group
    mine = values(RANK, (4, 3), 1)
    result = ALLREDUCES[variant](mine, name="ps.ar", process_set=process_set)
    assert_close(result, stacked(ranks, (4, 3), 1).mean(0))
    if variant.endswith("_"):
        assert result is mine


@pytest.mark.parametrize("op", ["sum-scaled", "min", "max", "int-sum"])
def test_allreduce_ops_and_scaling_on_the_set(group, op):
    process_set, ranks = group
    if op == "int-sum":
        mine = torch.full((5,), RANK + 1, dtype=torch.int32)
        result = hvd.allreduce(mine, op=hvd.Sum, process_set=process_set)
        assert torch.equal(result, torch.full((5,), sum(r + 1 for r in ranks), dtype=torch.int32))
        return
    everyone = stacked(ranks, (6,), 2)
    if op == "sum-scaled":
        result = hvd.allreduce(values(RANK, (6,), 2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                               process_set=process_set)
        assert_close(result, everyone.sum(0) / 2)
    else:
        reduce_op = hvd.Min if op == "min" else hvd.Max
        expected = everyone.min(0).values if op == "min" else everyone.max(0).values
        assert_close(hvd.allreduce(values(RANK, (6,), 2), op=reduce_op, process_set=process_set), expected)


def test_grouped_allreduce_of_several_tensors(group):
    process_set, ranks = group
    tensors = [values(RANK, (3,), 3), values(RANK, (2, 2), 4, torch.float64)]
    expected = [stacked(ranks, (3,), 3).sum(0), stacked(ranks, (2, 2), 4, torch.float64).sum(0)]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum, process_set=process_set)
    for result, want, dtype in zip(results, expected, [torch.float32, torch.float64]):
        assert_close(result, want, dtype)
    hvd.grouped_allreduce_(tensors, average=True, process_set=process_set)
    for tensor, want, dtype in zip(tensors, expected, [torch.float32, torch.float64]):
        assert_close(tensor, want / len(ranks), dtype)


ALLGATHERS = {
    "allgather": lambda t, **kw: hvd.allgather(t, **kw),
    "allgather_async": lambda t, **kw: hvd.synchronize(hvd.allgather_async(t, **kw)),
    "grouped_allgather": lambda t, **kw: hvd.grouped_allgather([t[:1], t], **kw)[1],
    "grouped_allgather_async": lambda t, **kw: hvd.synchronize(hvd.grouped_allgather_async([t[:1], t], **kw))[1],
}


@pytest.mark.parametrize("variant", list(ALLGATHERS))
def test_allgather_variants_gather_the_set_in_rank_order(group, variant):
    process_set, ranks = group
    pieces = {r: values(r, (ranks.index(r) + 1, 2), 5) for r in ranks}  # uneven rows
    result = ALLGATHERS[variant](pieces[RANK], process_set=process_set)
    assert torch.equal(result, torch.cat([pieces[r] for r in ranks]))


BROADCASTS = {
    "broadcast": lambda t, root, **kw: hvd.broadcast(t, root, **kw),
    "broadcast_async": lambda t, root, **kw: hvd.synchronize(hvd.broadcast_async(t, root, **kw)),
    "broadcast_": lambda t, root, **kw: hvd.broadcast_(t, root, **kw),
    "broadcast_async_": lambda t, root, **kw: hvd.synchronize(hvd.broadcast_async_(t, root, **kw)),
}


@pytest.mark.parametrize("variant", list(BROADCASTS))
def test_broadcast_variants_take_a_job_rank_as_root(group, variant):
    process_set, ranks = group
    for root in (ranks[-1], ranks[0]):
        mine = values(RANK, (3, 2), 6, torch.float64)
        result = BROADCASTS[variant](mine, root, process_set=process_set)
        assert torch.equal(result, values(root, (3, 2), 6, torch.float64))
        assert result is mine or not variant.endswith("_")


def test_broadcast_from_a_rank_outside_the_set_fails_on_every_member(group):
    process_set, ranks = group
    outsiders = [r for r in range(SIZE) if r not in ranks]
    if not outsiders:
        pytest.skip("every rank is in the set")
    with pytest.raises(ValueError, match=f"rank {outsiders[0]} is not in the process set"):
        hvd.broadcast(torch.ones(2), root_rank=outsiders[0], process_set=process_set)
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=process_set),
                       torch.full((1,), float(len(ranks))))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_alltoall_splits_among_the_set(group, asynchronous):
    process_set, ranks = group
    n, me = len(ranks), ranks.index(RANK)
    splits = [i + 1 for i in range(n)]  # i + 1 rows to the set's i-th rank
    data = torch.arange(sum(splits), dtype=torch.float32) + 100 * RANK
    if asynchronous:
        received, received_splits = hvd.synchronize(hvd.alltoall_async(data, splits, process_set=process_set))
    else:
        received, received_splits = hvd.alltoall(data, splits=torch.tensor(splits), process_set=process_set)
    offset = sum(splits[:me])
    expected = torch.cat([torch.arange(offset, offset + me + 1, dtype=torch.float32) + 100 * r for r in ranks])
    assert torch.equal(received, expected)
    assert received_splits.tolist() == [me + 1] * n
    even = hvd.alltoall(torch.full((n, 2), float(RANK)), process_set=process_set)  # rows alone without splits
    assert torch.equal(even, torch.tensor(ranks, dtype=torch.float32).repeat_interleave(2).reshape(n, 2))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_reducescatter_gives_each_member_its_block(group, asynchronous):
    process_set, ranks = group
    n, me = len(ranks), ranks.index(RANK)
    tall = values(RANK, (2 * n + 1, 3), 7)
    if asynchronous:
        mine = hvd.synchronize(hvd.reducescatter_async(tall, op=hvd.Sum, process_set=process_set))
    else:
        mine = hvd.reducescatter(tall, op=hvd.Sum, process_set=process_set)
    start = 0 if me == 0 else 3 + 2 * (me - 1)  # the set's first rank gets the odd row
    total = stacked(ranks, (2 * n + 1, 3), 7).sum(0)
    assert_close(mine, total[start:start + (3 if me == 0 else 2)])
    averaged = hvd.reducescatter(tall, process_set=process_set)
    assert_close(averaged, total[start:start + (3 if me == 0 else 2)] / n)


def test_barrier_join_and_objects(group):
    process_set, ranks = group
    hvd.barrier(process_set=process_set)
    assert hvd.allgather_object({"rank": RANK}, process_set=process_set) == [{"rank": r} for r in ranks]
    assert hvd.broadcast_object(RANK * 10, root_rank=ranks[-1], process_set=process_set) == ranks[-1] * 10
    # The set's last rank reduces alone while the others have joined (they add zeros),
    # so it joins last, and join returns its job rank everywhere.
    if RANK == ranks[-1]:
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.join", process_set=process_set),
                           torch.ones(2))
    assert hvd.join(process_set=process_set) == ranks[-1]


# -- gradients ---------------------------------------------------------------------------
def test_autograd_through_allreduce_allgather_broadcast(group):
    process_set, ranks = group
    x = torch.full((3,), float(RANK + 1), requires_grad=True)
    (hvd.allreduce(x, process_set=process_set) * (torch.arange(3.0) + RANK)).sum().backward()
    assert torch.allclose(x.grad, torch.stack([torch.arange(3.0) + r for r in ranks]).mean(0))

    rows = ranks.index(RANK) + 1
    y = torch.ones((rows, 2), requires_grad=True)
    gathered = hvd.allgather(y, process_set=process_set)
    assert gathered.shape == (len(ranks) * (len(ranks) + 1) // 2, 2)
    (gathered * (RANK + 1)).sum().backward()  # averaged over the set, as in Horovod
    mean = sum(r + 1 for r in ranks) / len(ranks)
    assert torch.allclose(y.grad, torch.full((rows, 2), mean))

    root = ranks[-1]
    z = torch.full((2,), float(RANK), requires_grad=True)
    (hvd.broadcast(z, root_rank=root, process_set=process_set) * (RANK + 1)).sum().backward()
    assert torch.allclose(z.grad, torch.full((2,), mean if RANK == root else 0.0))


def test_autograd_through_alltoall(group):
    # The set's i-th rank sends i + 1 rows to each member and weighs what it receives from
    # job rank q by (RANK + 1) * (q + 1): a row sent to job rank d gets (d + 1) * (RANK + 1).
    process_set, ranks = group
    me = ranks.index(RANK)
    x = torch.zeros((len(ranks) * (me + 1), 3), requires_grad=True)
    received, received_splits = hvd.alltoall(x, splits=[me + 1] * len(ranks), process_set=process_set)
    assert received_splits.tolist() == [i + 1 for i in range(len(ranks))]
    weights = torch.cat([torch.full((i + 1, 3), float((RANK + 1) * (q + 1))) for i, q in enumerate(ranks)])
    (received * weights).sum().backward()
    expected = torch.cat([torch.full((me + 1, 3), float((d + 1) * (RANK + 1))) for d in ranks])
    assert torch.equal(x.grad, expected)


# -- sets at the same time -------------------------------------------------------------------
@pytest.mark.skipif(SIZE < 2, reason="disjoint sets need 2 ranks")
def test_disjoint_sets_at_once_in_a_different_order_on_each_rank(sets):
    """Every rank submits the same names on its own set (names are the set's own) and one on
    the job, each rank in another order, and only then waits."""
    ranks = next(ranks for ranks in HALVES if RANK in ranks)
    process_set = sets[tuple(ranks)]
    names = [f"ps.concurrent.{i}" for i in range(4)]
    shift = ranks.index(RANK) + RANK
    order = names[shift % 4:] + names[:shift % 4]
    if RANK % 2:
        order.reverse()
    handles = {}
    for position, name in enumerate(order):
        if position == RANK % 4:
            handles["job"] = hvd.allreduce_async(torch.full((3,), float(RANK)), name=names[0], op=hvd.Sum)
        i = names.index(name)
        handles[name] = hvd.allreduce_async(values(RANK, (5,), 20 + i), name=name, op=hvd.Sum,
                                            process_set=process_set)
    assert torch.equal(hvd.synchronize(handles.pop("job")), torch.full((3,), SIZE * (SIZE - 1) / 2))
    for name in reversed(order):
        i = names.index(name)
        assert_close(hvd.synchronize(handles[name]), stacked(ranks, (5,), 20 + i).sum(0))


# -- a rank outside the set ------------------------------------------------------------------
def _outside_calls(process_set):
    """Every adapter call that takes a process set, on `process_set`."""
    leaf = torch.ones(2, requires_grad=True)
    model = torch.nn.Linear(2, 1)
    return {
        "allreduce": lambda: hvd.allreduce(torch.ones(2), process_set=process_set),
        "allreduce with grad": lambda: hvd.allreduce(leaf, process_set=process_set),
        "allreduce_async_": lambda: hvd.allreduce_async_(torch.ones(2), process_set=process_set),
        "non-contiguous allreduce": lambda: hvd.allreduce(torch.ones(3, 3).t(), process_set=process_set),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(2)], process_set=process_set),
        "bad grouped_allreduce_": lambda: hvd.grouped_allreduce_([leaf], process_set=process_set),
        "allgather": lambda: hvd.allgather(torch.ones(2), process_set=process_set),
        "allgather with grad": lambda: hvd.allgather(leaf, process_set=process_set),
        "grouped_allgather": lambda: hvd.grouped_allgather([torch.ones(2)], process_set=process_set),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), process_set.ranks[0], process_set=process_set),
        "broadcast with grad": lambda: hvd.broadcast(leaf, process_set.ranks[0], process_set=process_set),
        "broadcast_": lambda: hvd.broadcast_(torch.ones(2), process_set.ranks[0], process_set=process_set),
        "alltoall": lambda: hvd.alltoall(torch.ones(2), process_set=process_set),
        "alltoall with grad": lambda: hvd.alltoall(leaf, splits=[2], process_set=process_set),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(2), process_set=process_set),
        "barrier": lambda: hvd.barrier(process_set=process_set),
        "join": lambda: hvd.join(process_set=process_set),
        "broadcast_object": lambda: hvd.broadcast_object(1, process_set.ranks[0], process_set=process_set),
        "allgather_object": lambda: hvd.allgather_object(1, process_set=process_set),
        "broadcast_parameters": lambda: hvd.broadcast_parameters(model.state_dict(), process_set.ranks[0],
                                                                 process_set=process_set),
        "broadcast_optimizer_state": lambda: hvd.broadcast_optimizer_state(
            torch.optim.SGD(model.parameters(), lr=0.1), process_set.ranks[0], process_set=process_set),
        "SyncBatchNorm": lambda: hvd.SyncBatchNorm(2, process_set=process_set)(torch.ones(3, 2)),
    }


@pytest.mark.skipif(SIZE < 2, reason="a set without this rank needs 2 ranks")
def test_a_rank_outside_the_set_gets_a_value_error_from_every_call(sets):
    other = next(ranks for ranks in HALVES if RANK not in ranks)
    process_set = sets[tuple(other)]
    for what, call in _outside_calls(process_set).items():
        with pytest.raises(ValueError, match=re.escape(f"process set {other}, which does not include rank {RANK}")):
            call()
            pytest.fail(f"{what} on a set without this rank did not raise")
    # Nothing was left behind: the job's collectives go on.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(SIZE)))


@pytest.mark.skipif(SIZE < 2, reason="a set of fewer ranks than the job needs 2 ranks")
def test_a_removed_set_is_refused_clearly_and_can_be_added_again(sets):
    last = sets[(SIZE - 1,)]
    hvd.remove_process_set(last)
    try:
        with pytest.raises(ValueError, match="has not been added"):
            hvd.allreduce(torch.ones(2), process_set=last)
        with pytest.raises(ValueError, match="has not been added"):
            hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), process_set=last)
    finally:
        hvd.add_process_set(last)
    if RANK == SIZE - 1:
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=last), torch.ones(2))


# -- functions ---------------------------------------------------------------------------------
def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def local_step(rank):
    """A model and an SGD optimizer of its own on `rank`, one step taken (momentum state)."""
    model = make_model(seed=rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.5 + 0.1 * rank)
    generator = torch.Generator().manual_seed(rank)
    loss_fn(model, torch.randn(4, 5, generator=generator), torch.randn(4, 3, generator=generator)).backward()
    optimizer.step()
    return model, optimizer


def test_broadcast_parameters_and_optimizer_state_from_a_job_rank(group):
    process_set, ranks = group
    root = ranks[-1]
    model, optimizer = local_step(RANK)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=process_set)
    hvd.broadcast_optimizer_state(optimizer, root_rank=root, process_set=process_set)
    expected_model, expected_optimizer = local_step(root)
    for (name, p), q in zip(model.named_parameters(), expected_model.parameters()):
        assert torch.equal(p, q), name
    assert optimizer.param_groups[0]["lr"] == expected_optimizer.param_groups[0]["lr"]
    assert optimizer.param_groups[0]["momentum"] == expected_optimizer.param_groups[0]["momentum"]
    for p, q in zip(model.parameters(), expected_model.parameters()):
        assert torch.equal(optimizer.state[p]["momentum_buffer"], expected_optimizer.state[q]["momentum_buffer"])
    fresh = make_model(seed=10 + RANK)
    hvd.broadcast_parameters(fresh.named_parameters(), root_rank=ranks[0], process_set=process_set)
    for p, q in zip(fresh.parameters(), make_model(seed=10 + ranks[0]).parameters()):
        assert torch.equal(p, q)


# -- DistributedOptimizer ------------------------------------------------------------------------
PER_RANK = 4
STEPS = 3


def group_batches(ranks, seed):
    """Batches of the set (PER_RANK rows per member); each set its own data."""
    generator = torch.Generator().manual_seed(seed)
    n = len(ranks) * PER_RANK
    return [(torch.randn(n, 5, generator=generator), torch.randn(n, 3, generator=generator)) for _ in range(STEPS)]


def my_rows(ranks, tensor):
    me = ranks.index(RANK)
    return tensor[me * PER_RANK:(me + 1) * PER_RANK]


OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {}),
    "adam-two-groups": (lambda p: torch.optim.Adam(p, lr=0.01), dict(groups=2)),
    "predivide": (lambda p: torch.optim.SGD(p, lr=0.1), dict(gradient_predivide_factor=2.0)),
    "sum": (lambda p: torch.optim.SGD(p, lr=0.02), dict(op=hvd.Sum)),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_distributed_optimizer_trains_each_set_like_one_process(group, name):
    """Each set is a replica group: it averages its members' gradients only, which is one
    process training on the set's whole batch (Sum: the set's size times that gradient)."""
    process_set, ranks = group
    make_optimizer, options = OPTIMIZERS[name]
    batches = group_batches(ranks, seed=100 + ranks[0])
    model = make_model()
    optimizer = hvd.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                         process_set=process_set, **options)
    reference = make_model()
    plain = make_optimizer(reference.parameters())
    scale = len(ranks) if options.get("op") == hvd.Sum else 1
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, my_rows(ranks, x), my_rows(ranks, y)).backward()
        optimizer.step()
        plain.zero_grad()
        (loss_fn(reference, x, y) * scale).backward()
        plain.step()
    for (param_name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-5, msg=param_name)


def test_sparse_gradients_are_averaged_over_the_set(group):
    process_set, ranks = group

    def embedding():
        torch.manual_seed(3)
        return torch.nn.Embedding(10, 3, sparse=True)

    generator = torch.Generator().manual_seed(7 + ranks[0])
    indices = torch.randint(0, 10, (len(ranks) * PER_RANK,), generator=generator)
    targets = torch.randn(len(ranks) * PER_RANK, 3, generator=generator)
    model, reference = embedding(), embedding()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters(), process_set=process_set)
    plain = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(my_rows(ranks, indices)), my_rows(ranks, targets)).backward()
        optimizer.step()
        plain.zero_grad()
        torch.nn.functional.mse_loss(reference(indices), targets).backward()
        plain.step()
    torch.testing.assert_close(model.weight.detach(), reference.weight.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(SIZE < 2, reason="a set without this rank needs 2 ranks")
def test_distributed_optimizer_on_a_rank_outside_its_set_applies_its_own_gradients(sets):
    """As in Horovod: the set's members average among themselves; the others reduce nothing."""
    other = next(ranks for ranks in HALVES if RANK not in ranks)
    model, reference = make_model(), make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), process_set=sets[tuple(other)])
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in group_batches([RANK], seed=300 + RANK):
        for net, opt in ((model, optimizer), (reference, plain)):
            opt.zero_grad()
            loss_fn(net, x, y).backward()
            opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_after_a_reform_a_set_optimizer_refuses_to_step_and_a_job_one_goes_on(group):
    """What the re-form callback (hvdplus.elastic) does: sets are gone after it."""
    process_set, ranks = group
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), process_set=process_set)
    optimizer._hvdplus_reformed()
    x, y = group_batches(ranks, seed=5)[0]
    optimizer.zero_grad()
    loss_fn(model, my_rows(ranks, x), my_rows(ranks, y)).backward()
    if process_set is hvd.global_process_set:
        optimizer.step()
        return
    with pytest.raises(ValueError, match="the job re-formed .* add the set again and wrap the optimizer anew"):
        optimizer.step()


# -- SyncBatchNorm ---------------------------------------------------------------------------------
def test_sync_batch_norm_normalizes_over_the_set(group):
    process_set, ranks = group
    generator = torch.Generator().manual_seed(40 + ranks[0])
    inputs = torch.randn(len(ranks) * 3, 2, generator=generator, dtype=torch.float64)
    weights = torch.randn(len(ranks) * 3, 2, generator=generator, dtype=torch.float64)
    layer = hvd.SyncBatchNorm(2, process_set=process_set).double()
    reference = torch.nn.BatchNorm1d(2).double()
    me = slice(3 * ranks.index(RANK), 3 * ranks.index(RANK) + 3)
    local = inputs[me].clone().requires_grad_()
    (layer(local) * weights[me]).sum().backward()
    whole = inputs.clone().requires_grad_()
    expected = reference(whole)
    (expected * weights).sum().backward()
    torch.testing.assert_close(layer(local.detach()), expected[me].detach())  # again: same batch statistics
    torch.testing.assert_close(local.grad, whole.grad[me])
    torch.testing.assert_close(hvd.allreduce(layer.weight.grad, op=hvd.Sum, process_set=process_set),
                               reference.weight.grad)
