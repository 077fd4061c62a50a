"""Memory and throughput of sharded optimizer state (ZeRO), measured.

    hvdplusrun -np 4 python benchmarks/memory.py --params 100e6

An MLP of about `--params` parameters (float32, width `--width`) trains with Adam, one way
after the other in the same job: hvd.DistributedOptimizer, hvd.ZeroRedundancyOptimizer
stage 1 and stage 2 (`shard_gradients=True`), and torch's ZeroRedundancyOptimizer beside
DistributedDataParallel on gloo. For each way, each rank reports:

- `state_bytes`: the bytes of its optimizer's state tensors after the last step;
- `peak_rss_bytes`: the highest resident memory of the process while the way ran (read from
  /proc/self/statm by a thread every millisecond and at the points of a step where it peaks),
  and `peak_over_start_bytes`, that less the resident memory before the model was built;
- `samples_per_s`: samples (all ranks') per second, the median of `--steps` timed steps after
  two warm-up steps.

The model of each way is freed before the next is built, and large tensors are given back to
the system when freed, so each way's peak is its own. A first, unrecorded run of the first way
pays what a process allocates once (the allocator's arenas, the engine's buffers), which would
otherwise count against whichever way came first. Writes benchmarks/results/memory_np<ranks>.csv
(see harness.write_results) and prints a table.
"""

import argparse
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist

import hvdplus.torch as hvd
from harness import add_csv_option, write_results
from tables import markdown_table

WAYS = ("distributed", "zero1", "zero2", "torch_zero_ddp")
BATCH_PER_RANK = 32
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


class PeakResident:
    """The highest resident memory seen since start(), sampled by a thread and by `now()`."""

    def __init__(self):
        self.peak = 0
        self._running = False

    def now(self):
        self.peak = max(self.peak, resident_bytes())

    def _sample(self):
        while self._running:
            self.now()
            time.sleep(0.001)

    def __enter__(self):
        self.peak = resident_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._running = False
        self._thread.join()


def make_model(params, width):
    """An MLP of square layers of `width`, as many as make about `params` parameters."""
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*modules)


def wrapped(way, model):
    """(the module to call, the optimizer) of `way`."""
    if way == "distributed":
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                             named_parameters=model.named_parameters())
        return model, optimizer
    if way in ("zero1", "zero2"):
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, shard_gradients=way == "zero2",
                                                named_parameters=model.named_parameters(), lr=1e-4)
        return model, optimizer
    from torch.distributed.optim import ZeroRedundancyOptimizer
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-4)
    return torch.nn.parallel.DistributedDataParallel(model), optimizer


def state_bytes(optimizer):
    state = optimizer.optim.state if hasattr(optimizer, "optim") else optimizer.state
    return sum(value.numel() * value.element_size() for per_param in state.values()
               for value in per_param.values() if torch.is_tensor(value))


def measure(way, args):
    start = resident_bytes()
    with PeakResident() as peak:
        model = make_model(args.params, args.width)
        module, optimizer = wrapped(way, model)
        x = torch.randn(BATCH_PER_RANK, args.width)
        seconds = []
        for step in range(args.steps + 2):
            hvd.barrier()
            began = time.perf_counter()
            optimizer.zero_grad()
            module(x).square().mean().backward()
            peak.now()
            optimizer.step()
            peak.now()
            hvd.barrier()
            if step >= 2:
                seconds.append(time.perf_counter() - began)
        held = state_bytes(optimizer)
        parameters = sum(p.numel() for p in model.parameters())
        del module, optimizer, model
    return {"way": way, "rank": hvd.rank(), "parameters": parameters, "state_bytes": held,
            "peak_rss_bytes": peak.peak, "peak_over_start_bytes": peak.peak - start,
            "samples_per_s": BATCH_PER_RANK * hvd.size() / statistics.median(seconds)}


def mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"


def start_gloo():
    """torch.distributed on gloo over the same ranks, for torch's ZeroRedundancyOptimizer."""
    if dist.is_initialized():
        return
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0, name="gloo port")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())


def _free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6, help="parameters of the MLP, about")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    add_csv_option(parser)
    args = parser.parse_args()
    args.params = int(args.params)
    torch.set_num_threads(1)
    hvd.init()
    rows = []
    ways = args.ways.split(",")
    if "torch_zero_ddp" in ways:
        start_gloo()
    measure(ways[0], args)  # unrecorded: what the process allocates once
    for way in ways:
        every = hvd.allgather_object(measure(way, args), name=f"memory.{way}")
        rows += every
    if hvd.rank() == 0:
        print(markdown_table(
            ["way", "rank", "parameters", "optimizer state", "peak resident", "peak over start", "samples/s"],
            [[row["way"], row["rank"], row["parameters"], mib(row["state_bytes"]), mib(row["peak_rss_bytes"]),
              mib(row["peak_over_start_bytes"]), f"{row['samples_per_s']:.1f}"] for row in rows]), flush=True)
    write_results("memory", rows, {"torch": torch.__version__}, args.csv)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
