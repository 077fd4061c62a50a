"""A PyTorch program written against Horovod's API (`import horovod.torch as hvd`), run by
tests/test_horovod_compat.py under `horovodrun` on 2 and 3 ranks. Every check is against
what Horovod documents, computed here with torch on one process; it prints
"torch program ok on rank <r>" at the end."""

import torch
from mpi4py import MPI

import horovod
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.torch.elastic import ElasticSampler, TorchState

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert horovod.__version__.startswith("0.28.1+hvdplus")
assert hvd.mpi_enabled() and hvd.mpi_built() and not hvd.gloo_enabled() and not hvd.nccl_built()
assert issubclass(HorovodInternalError, RuntimeError) and issubclass(HostsUpdatedInterrupt, RuntimeError)
assert ElasticSampler is not None and TorchState is not None

# Integers: Average (Horovod's default op) and scale factors truncate toward zero.
every = [torch.tensor([2 * r + 1, -(3 * r + 2), 7 * r], dtype=torch.float64) for r in range(size)]
averaged = hvd.allreduce(every[rank].to(torch.int64), name="int.average")
assert averaged.dtype == torch.int64
assert torch.equal(averaged, torch.trunc(torch.stack(every).sum(0) / size).to(torch.int64)), averaged
scaled = hvd.allreduce(every[rank].to(torch.int32), op=hvd.Sum, prescale_factor=0.5, name="int.scaled")
assert torch.equal(scaled, torch.stack([torch.trunc(0.5 * e) for e in every]).sum(0).to(torch.int32)), scaled


# Gradients as Horovod defines them. Rank r's loss weighs its outputs by numbers of its own;
# one process computes the gradient of the sum of every rank's loss with autograd, from every
# rank's inputs; Horovod's gradient is `factor` times it: 1 for all-reduces, 1/size for
# allgather and broadcast (each rank's loss as its share of one mean), size for reducescatter.
def numbers(r, shape, seed, grad=False):
    """The same numbers on every rank (rank r's input `seed`, or with seed + 50 its weights)."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(1000 * seed + r), dtype=torch.float64)
    return values.requires_grad_(grad)


def check_gradients(what, shapes, collective, reference, factor):
    mine = [numbers(rank, shape, i, grad=True) for i, shape in enumerate(shapes(rank))]
    outputs = collective(mine)
    sum((out * numbers(rank, out.shape, i + 50)).sum() for i, out in enumerate(outputs)).backward()
    everyone = [[numbers(r, shape, i, grad=True) for i, shape in enumerate(shapes(r))] for r in range(size)]
    sum((out * numbers(r, out.shape, i + 50)).sum() for r in range(size)
        for i, out in enumerate(reference(everyone, r))).backward()
    for i, (out, want) in enumerate(zip(outputs, reference(everyone, rank))):
        assert torch.allclose(out, want.detach()), (what, "output", i, out, want)
    for i, (got, want) in enumerate(zip(mine, everyone[rank])):
        want = torch.zeros_like(got) if want.grad is None else want.grad
        assert torch.allclose(got.grad, factor * want), (what, "gradient", i, got.grad, factor * want)


def reduced(everyone, i, op, prescale=1.0, postscale=1.0):
    total = postscale * sum(prescale * inputs[i] for inputs in everyone)
    return total / size if op == hvd.Average else total


def block(everyone, r, i, op, prescale=1.0, postscale=1.0):
    """Rank r's rows of the reduction: the first ranks get one more where they do not divide."""
    return torch.tensor_split(reduced(everyone, i, op, prescale, postscale), size)[r]


check_gradients("allgather", lambda r: [(r + 1, 2)], lambda xs: [hvd.allgather(xs[0], name="gather.grad")],
                lambda every, r: [torch.cat([inputs[0] for inputs in every])], 1 / size)
check_gradients("broadcast", lambda r: [(3,)], lambda xs: [hvd.broadcast(xs[0], root_rank=0, name="bcast.grad")],
                lambda every, r: [every[0][0]], 1 / size)
check_gradients("grouped_allreduce", lambda r: [(3, 2), (4,)],
                lambda xs: hvd.grouped_allreduce(xs, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
                lambda every, r: [reduced(every, i, hvd.Sum, 0.5, 3.0) for i in range(2)], 1)
check_gradients("grouped_allreduce Average", lambda r: [(2,), (1, 3)],
                lambda xs: hvd.grouped_allreduce(xs, name="grouped.average.grad"),
                lambda every, r: [reduced(every, i, hvd.Average) for i in range(2)], 1)
check_gradients("grouped_allgather", lambda r: [(r + 1, 2), (2 * r + 1, 3, 2)],
                lambda xs: hvd.grouped_allgather(xs, name="grouped.gather.grad"),
                lambda every, r: [torch.cat([inputs[i] for inputs in every]) for i in range(2)], 1 / size)
check_gradients("reducescatter", lambda r: [(2 * size + 1, 3)],
                lambda xs: [hvd.reducescatter(xs[0], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)],
                lambda every, r: [block(every, r, 0, hvd.Sum, 2.0, 0.25)], size)
check_gradients("grouped_reducescatter", lambda r: [(size, 2), (3 * size - 1,)],
                lambda xs: hvd.grouped_reducescatter(xs, name="grouped.rs.grad"),
                lambda every, r: [block(every, r, i, hvd.Average) for i in range(2)], size)


def raises(error_class, call, words):
    try:
        call()
    except error_class as error:
        assert words in str(error), error
        return error
    raise AssertionError(f"expected {error_class.__name__} saying {words!r}")


# Errors Horovod raises as RuntimeError; hvdplus's argument errors stay ValueErrors too.
for call in (lambda: hvd.reducescatter(torch.ones(size, 2), op=hvd.Adasum, name="rs.adasum"),
             lambda: hvd.grouped_reducescatter([torch.ones(size, 2)], op=hvd.Adasum, name="grouped.rs.adasum")):
    assert isinstance(raises(RuntimeError, call, "op Adasum combines whole tensors"), ValueError)
raises(RuntimeError, lambda: hvd.reducescatter(torch.ones(size + rank, 2), name="rs.shapes"),
       "Mismatched shapes for 'rs.shapes'")

# Names of Horovod's API that programs call.
dense = torch.zeros(4, 2)
dense[rank % 4] = 1.0
summed = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Sum))
assert torch.equal(summed.to_dense(), sum(torch.zeros(4, 2).index_fill_(0, torch.tensor([r % 4]), 1.0)
                                          for r in range(size)))
parts = hvd.grouped_reducescatter([torch.ones(size, 3) * (rank + 1)], op=hvd.Sum, name="grouped.rs")
assert torch.equal(parts[0], torch.full((1, 3), size * (size + 1) / 2))

# A queued operation polls as not done until every rank has submitted it: the last rank
# submits only once rank 0 has polled (it waits for rank 0's word, through mpi4py).
if rank == size - 1 and size > 1:
    MPI.COMM_WORLD.recv(source=0, tag=7)
handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="polled")
if rank == 0 and size > 1:
    assert not hvd.poll(handle)
    MPI.COMM_WORLD.send("polled", dest=size - 1, tag=7)
assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(size)))


# broadcast_optimizer_state gives every rank rank 0's state and options: here a tensor lr,
# and parameters without state (no gradient yet): rank 0 has state for `a` alone.
def adam_after_a_step(r):
    torch.manual_seed(7)
    a, b, c = (torch.nn.Parameter(torch.randn(3)) for _ in range(3))
    optimizer = torch.optim.Adam([{"params": [a, b]}, {"params": [c], "lr": torch.tensor(0.5 + r)}],
                                 lr=torch.tensor(0.01 * (r + 1)), betas=(0.9, 0.99 - 0.01 * r))
    loss = (r + 1) * a.sum()
    if r > 0:
        loss = loss + (b * b).sum()
    loss.backward()
    optimizer.step()
    return optimizer


def same(x, y):
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
    return x == y


adam = adam_after_a_step(rank)
hvd.broadcast_optimizer_state(adam, root_rank=0)
assert same(adam.state_dict(), adam_after_a_step(0).state_dict()), adam.state_dict()
assert list(adam.state_dict()["state"]) == [0]


# DistributedOptimizer trains a model with a sparse embedding as one process does on the
# whole batch (mean loss): its gradient is gathered and averaged, and stays sparse, so
# SparseAdam takes it; with sparse_as_dense=True it is averaged dense and handed back sparse,
# as Horovod does. broadcast_optimizer_state primes the fresh optimizers as Horovod's does,
# with a step on zero gradients, which the one process takes too.
def sparse_adam_and_adam(model):
    return [torch.optim.SparseAdam(model[0].parameters(), lr=0.05), torch.optim.Adam(model[2].parameters(), lr=0.05)]


def sgd_over_all(model):
    return [torch.optim.SGD(model.parameters(), lr=0.2)]


generator = torch.Generator().manual_seed(11)
batches = [(torch.randint(0, 12, (3 * size, 2), generator=generator),
            torch.randn(3 * size, 1, generator=generator, dtype=torch.float64)) for _ in range(4)]


def trained(optimizers_for, distributed, sparse_as_dense=False):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Embedding(12, 4, sparse=True), torch.nn.Flatten(),
                                torch.nn.Linear(8, 1)).double()
    optimizers, rows = optimizers_for(model), slice(None)
    if distributed:
        names = {p: name for name, p in model.named_parameters()}
        optimizers = [hvd.DistributedOptimizer(opt, [(names[p], p) for p in opt.param_groups[0]["params"]],
                                               sparse_as_dense=sparse_as_dense) for opt in optimizers]
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for opt in optimizers:
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        rows = slice(3 * rank, 3 * rank + 3)
    else:
        for opt in optimizers:
            for p in opt.param_groups[0]["params"]:
                zero = torch.zeros_like(p)
                p.grad = zero.to_sparse() if isinstance(opt, torch.optim.SparseAdam) else zero
            opt.step()
    for x, target in batches:
        for opt in optimizers:
            opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), target[rows]).backward()
        for opt in optimizers:
            opt.step()
    return model


for optimizers_for, sparse_as_dense in ((sparse_adam_and_adam, False), (sgd_over_all, False),
                                        (sparse_adam_and_adam, True)):
    model = trained(optimizers_for, True, sparse_as_dense)
    reference = trained(optimizers_for, False)
    assert model[0].weight.grad.is_sparse, optimizers_for.__name__
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-9), (optimizers_for.__name__, name, mine, theirs)

# DistributedOptimizer(op=Adasum) on a power-of-two number of ranks: with plain SGD, the
# step is -lr * Adasum of the ranks' gradients (Horovod's combination of the steps).
def adasum(a, b):
    dot = torch.dot(a, b)
    return (1 - dot / (2 * torch.dot(a, a))) * a + (1 - dot / (2 * torch.dot(b, b))) * b


if size & (size - 1) == 0:
    torch.manual_seed(5)
    net = torch.nn.Linear(3, 2)
    start = [p.detach().clone() for p in net.parameters()]
    adasum_optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5),
                                                named_parameters=net.named_parameters(), op=hvd.Adasum)
    inputs = torch.arange(3.0) + rank
    adasum_optimizer.zero_grad()
    (net(inputs) ** 2).sum().backward()
    local = [p.grad.detach().clone().reshape(-1) for p in net.parameters()]
    everyone = hvd.allgather_object(local)
    adasum_optimizer.step()
    for index, (param, before) in enumerate(zip(net.parameters(), start)):
        level = [grads[index].double() for grads in everyone]
        while len(level) > 1:
            level = [adasum(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        want = before.double().reshape(-1) - 0.5 * level[0]
        assert torch.allclose(param.detach().double().reshape(-1), want, atol=1e-6), (index, param, want)

# A broadcast beside a joined rank raises on the ranks that call it, as in Horovod.
if rank == size - 1:
    last = hvd.join()
else:
    for call, name in ((lambda: hvd.broadcast(torch.ones(2), root_rank=0, name="bcast.joined"), "bcast.joined"),
                       (lambda: hvd.broadcast_(torch.ones(2), root_rank=0, name="bcast_.joined"), "bcast_.joined")):
        raises(RuntimeError, call, f"broadcast '{name}' cannot run while ranks [{size - 1}] have joined "
                                   "(Horovod: Broadcast is not supported with Join at this time.)")
    last = hvd.join()
assert last != size - 1 and hvd.allgather_object(last) == [last] * size

# join(device) returns the rank that joined last: rank 0 all-reduces first, which completes
# only once the others have joined (they add zeros).
if rank == 0:
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="before.join"), torch.ones(1))
assert hvd.join(device=-1) == 0
print(f"torch program ok on rank {rank}", flush=True)
