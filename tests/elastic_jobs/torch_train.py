"""An elastic PyTorch training job for tests/test_elastic.py: a linear model on a fixed
dataset whose samples carry their ids, trained with hvdplus.elastic.run.

    train.py OUT [--kill RANK:STEP:PHASE ...] [--epochs E] [--zero STAGE]

Each committed step appends (epoch, size, the ids of every rank's batch) to the state's
log, so the test can check that every sample was committed once per epoch, and replay
the steps with numpy. A rank named by --kill dies (SIGKILL) at that committed step, in
that phase: "step" (before its forward pass), "backward" (with some of its gradients'
all-reduces submitted), "commit" (inside state.commit), "sync" (inside the state's sync
after a re-form), "end" (after the last commit). With --balancer, every step also feeds
a LoadBalancer, which must follow each re-form by itself: sizes for the job's new size. With
--grow, rank 0 adds slots for the launcher's host discovery to find at a given step. Each kill
happens once per job: a marker file next to OUT remembers it across restarts. With --zero 1 or
2, the optimizer is hvd.ZeroRedundancyOptimizer at that stage (at 3 ranks the model's two
parameters leave one rank owning none), whose commits must reshard over the survivors.
"""

import argparse
import time

import numpy as np
import torch

import hvdplus.torch as hvd
import replay
from kills import Kills

SAMPLES, FEATURES, BATCH = 96, 4, 4


def dataset():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5)[:, None]
    return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(SAMPLES))


def initial_model():
    model = torch.nn.Linear(FEATURES, 1)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-0.2, 0.2, FEATURES))
        model.bias.zero_()
    return model


def check_sizes(balancer, rank, size, re_formed):
    """One step's record and rebalance; the sizes must be the job's, and even in the first step
    after a re-form (`re_formed`: the balancer must have started afresh)."""
    balancer.record(BATCH, 0.001 * BATCH * (rank + 1))
    sizes = balancer.rebalance()
    even = [balancer.global_batch_size // size] * size
    if (len(sizes) != size or sum(sizes) != balancer.global_batch_size or (re_formed and sizes != even)
            or balancer.local_batch_size() != sizes[rank] or balancer.offset() != sum(sizes[:rank])):
        raise AssertionError(f"rank {rank} of {size}: the balancer's sizes {sizes} (this rank's "
                             f"{balancer.local_batch_size()} at {balancer.offset()}) do not fit the job"
                             + (", the first step after a re-form" if re_formed else ""))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--grow", metavar="FILE:STEP:SLOTS",
                        help="at STEP, rank 0 writes 'localhost:SLOTS' to FILE (which discovery reads)")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--balancer", action="store_true")
    parser.add_argument("--zero", type=int, choices=[1, 2], help="a ZeroRedundancyOptimizer of this stage")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    kills = Kills(args.kill, args.out)
    data = dataset()
    model = initial_model()
    if args.zero:
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, shard_gradients=args.zero == 2,
                                                named_parameters=model.named_parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=11)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, log=[])
    resets = []  # the job's size after each re-form this process saw
    re_formed = []  # the balancer's check of the next step is that of the first after a re-form
    state.register_reset_callbacks([lambda: resets.append(hvd.size()), lambda: re_formed.append(True)])
    # Not reset by a callback: it follows the re-form by itself. Rank r records r + 1 ms per
    # sample, so the sizes move away from even ones once every rank has measured.
    balancer = hvd.LoadBalancer(global_batch_size=12, warmup_steps=0) if args.balancer else None

    original_save, original_sync = state.save, state.sync

    def save():
        original_save()
        kills.maybe(len(state.log), "commit")

    def sync():
        kills.maybe(len(state.log), "sync")
        original_sync()

    state.save, state.sync = save, sync

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=state.sampler)
            for batch_idx, (x, y, ids) in enumerate(loader):
                step = len(state.log)
                kills.maybe(step, "step")
                time.sleep(args.step_seconds)
                if args.grow and hvd.rank() == 0 and step == int(args.grow.split(":")[1]):
                    with open(args.grow.split(":")[0], "w") as file:
                        file.write(f"localhost:{args.grow.split(':')[2]}\n")
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                if kills.planned("backward"):
                    model.bias.register_post_accumulate_grad_hook(lambda _: kills.maybe(step, "backward"))
                loss.backward()
                optimizer.step()
                if balancer is not None:
                    check_sizes(balancer, hvd.rank(), hvd.size(), bool(re_formed))
                    re_formed.clear()
                batches = hvd.allgather_object(ids.tolist(), name="ids")
                state.sampler.record_batch(batch_idx, BATCH)
                state.log.append((state.epoch, hvd.size(), batches))
                state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    kills.maybe(len(state.log), "end")
    replay.save(args.out, state.log, resets, model.weight.detach().numpy(), model.bias.detach().numpy())


if __name__ == "__main__":
    main()
