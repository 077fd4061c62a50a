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

# allgather's and broadcast's gradients are averaged over the ranks.
y = torch.ones((rank + 1, 2), requires_grad=True)
(hvd.allgather(y, name="gather.grad") * (rank + 1)).sum().backward()
assert torch.allclose(y.grad, torch.full_like(y, (size + 1) / 2)), y.grad
z = torch.zeros(3, requires_grad=True)
(hvd.broadcast(z, root_rank=0, name="bcast.grad") * (rank + 1)).sum().backward()
assert torch.allclose(z.grad, torch.full_like(z, (size + 1) / 2 if rank == 0 else 0.0)), z.grad

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


# DistributedOptimizer on a model with a sparse embedding trains as one process on the whole batch.
def model_and_optimizer(distributed):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Embedding(12, 4, sparse=True), torch.nn.Flatten(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return model, optimizer


generator = torch.Generator().manual_seed(11)
batches = [(torch.randint(0, 12, (2 * size, 2), generator=generator), torch.randn(2 * size, 1, generator=generator))
           for _ in range(4)]
model, optimizer = model_and_optimizer(True)
reference, plain = model_and_optimizer(False)
for x, target in batches:
    for net, opt, rows in ((model, optimizer, slice(2 * rank, 2 * rank + 2)), (reference, plain, slice(None))):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[rows]), target[rows]).backward()
        opt.step()
for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
    assert torch.allclose(mine, theirs, atol=1e-6), name

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

# join(device) returns the rank that joined last: rank 0 all-reduces first, which completes
# only once the others have joined (they add zeros).
if rank == 0:
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="before.join"), torch.ones(1))
assert hvd.join(device=-1) == 0
print(f"torch program ok on rank {rank}", flush=True)
