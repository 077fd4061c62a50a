"""The MPI job of benchmarks/regimes.py, run in the containers it starts
(benchmarks/linked_hosts.py), one rank a host: an MLP of about 10M parameters trained on
scikit-learn's digits (from the .npz the driver writes) in each way in turn, hvdplus' regimes
and torch's DDP on gloo side by side.

    links_job.py DATA --measure throughput|accuracy [--steps N] --ways NAME ...

throughput: each way's seconds per step over whole averaging periods, after two steps
that pay for the first collectives, and the bytes this host sent meanwhile (its eth0's
counter: everything on the wire, the framework's headers and MPI's included).
accuracy: each way trains --steps steps from the same start, then the ranks' models are
averaged (for the local regimes, the model a user takes at the end) and tested on the held-out
digits. Rank 0 prints one line, "RESULT <json>".
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer

import hvdplus.torch as hvd
from harness import library_versions

WIDTH = 2240  # 64 -> 2240 -> 2240 -> 2240 -> 10: 10.2M parameters
LOCAL_BATCH = 32
LEARNING_RATE = 0.02
WARM_STEPS = 2  # left out of the throughput: the first collectives' and allocations' costs
GLOO_PORT = 29517

# name: (maker, steps between two exchanges of the model, for whole periods in the timing)
WAYS = {
    "synchronous": ("sync", 1),
    "local SGD H=4": ("local", 4),
    "local SGD H=16": ("local", 16),
    "DiLoCo H=50": ("diloco", 50),
    "staleness=1": ("stale", 1),
    "torch DDP": ("ddp", 1),
    "torch post-local SGD H=4": ("post_local", 4),
    "torch post-local SGD H=16": ("post_local", 16),
}


def mlp():
    torch.manual_seed(0)  # the same start on every rank and in every way
    return torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, 10))


def sgd(params):
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9)


def make(way, model):
    """(the module to call, the optimizer) of `way`, from a fresh `model`."""
    kind, period = WAYS[way]
    named = list(model.named_parameters())
    if kind == "sync":
        return model, hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named)
    if kind == "stale":
        return model, hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named, staleness=1)
    if kind == "local":
        return model, hvd.LocalSGD(sgd(model.parameters()), model, period=period, name=f"local{period}")
    if kind == "diloco":
        return model, hvd.DiLoCo(sgd(model.parameters()), model, period=period)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if kind == "ddp":
        return ddp, sgd(model.parameters())
    # torch's post-local SGD, all local after the start: no gradient all-reduce at all, and the
    # averager averages the parameters every `period` steps, as hvd.LocalSGD(warmup_steps=0).
    ddp.register_comm_hook(PostLocalSGDState(None, None, start_localSGD_iter=0,
                                             post_local_gradient_allreduce=False), post_localSGD_hook)
    return ddp, PostLocalSGDOptimizer(sgd(model.parameters()), PeriodicModelAverager(period=period, warmup_steps=0))


def sent_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as counter:
        return int(counter.read())


def batches(data, rank, size):
    """Endless local batches: each epoch's permutation (the same on every rank) dealt out."""
    x, y = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"])
    epoch = 0
    while True:
        order = torch.from_numpy(np.random.default_rng(epoch).permutation(len(x)))[rank::size]
        for start in range(0, len(order) - LOCAL_BATCH + 1, LOCAL_BATCH):
            chosen = order[start:start + LOCAL_BATCH]
            yield x[chosen], y[chosen]
        epoch += 1


def train(way, data, steps, on_step=None):
    model = mlp()
    module, optimizer = make(way, model)
    feed = batches(data, hvd.rank(), hvd.size())
    for step in range(steps):
        if on_step:
            on_step(step)
        x, y = next(feed)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    if WAYS[way][0] == "stale":
        optimizer.state_dict()  # waits for the last step's all-reduces, still in flight
    return model


def throughput(way, data):
    """(seconds per step, bytes this host sent per step) over two whole periods."""
    period = WAYS[way][1]
    steps = max(2 * period, 8)
    marks = {}

    def on_step(step):
        if step in (WARM_STEPS, WARM_STEPS + steps):
            hvd.allreduce(torch.zeros(1), name=f"mark.{way}.{step}")  # the ranks start the clock together
            marks[step] = (time.perf_counter(), sent_bytes())

    train(way, data, WARM_STEPS + steps + 1, on_step)
    (start, sent_before), (end, sent_after) = marks[WARM_STEPS], marks[WARM_STEPS + steps]
    return (end - start) / steps, (sent_after - sent_before) / steps


def accuracy(way, data, steps):
    model = train(way, data, steps)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(hvd.allreduce(param, name=f"final.{way}.{name}"))
        predicted = model(torch.from_numpy(data["x_test"])).argmax(dim=1).numpy()
    return float((predicted == data["y_test"]).mean())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--measure", choices=["throughput", "accuracy"], required=True)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--ways", nargs="+", required=True, choices=list(WAYS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    master = hvd.broadcast_object(os.uname().nodename, root_rank=0, name="gloo.master")
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{GLOO_PORT}", rank=hvd.rank(),
                            world_size=hvd.size())
    data = dict(np.load(args.data))
    rows = []
    for way in args.ways:
        if args.measure == "throughput":
            seconds, sent = throughput(way, data)
            global_batch = LOCAL_BATCH * hvd.size()
            rows.append({"way": way, "seconds_per_step": seconds, "samples_per_s": global_batch / seconds,
                         "bytes_sent_per_sample": hvd.allreduce(torch.tensor(float(sent)), op=hvd.Sum,
                                                                name=f"sent.{way}").item() / global_batch})
        else:
            rows.append({"way": way, "steps": args.steps, "accuracy": accuracy(way, data, args.steps)})
    if hvd.rank() == 0:
        parameters = sum(p.numel() for p in mlp().parameters())
        print("RESULT " + json.dumps({"rows": rows, "parameters": parameters, "ranks": hvd.size(),
                                      **library_versions({"torch": torch.__version__})}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
