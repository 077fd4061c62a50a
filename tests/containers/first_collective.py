"""For benchmarks/slurm.py: how soon a job's first collective is done. Each rank joins the
job and all-reduces arange(4) * (rank + 1) once; rank 0 notes `time.time()` as soon as the
sum is back, checks it, and writes that time to --time-file. The containers share the
machine's clock, so the driver outside compares it with the moment it called sbatch.

By default the job is hvdplus.torch's (started by hvdplusrun, or by `srun --mpi=pmix`); with
--torch it is torch.distributed's over gloo, as torchrun starts it (its variables give the
rank, the size and the store). Both import torch before they join, so both pay for it.
"""

import argparse
import time

import torch

__all__ = ["hvdplus_sum", "torch_sum", "main"]


def contribution(rank):
    return torch.arange(4.0) * (rank + 1)


def hvdplus_sum():
    """(rank, size, the sum of every rank's contribution) through hvdplus.torch."""
    import hvdplus.torch as hvd

    hvd.init()
    return hvd.rank(), hvd.size(), hvd.allreduce(contribution(hvd.rank()), op=hvd.Sum, name="first")


def torch_sum():
    """(rank, size, the sum of every rank's contribution) through torch.distributed over gloo."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = contribution(dist.get_rank())
    dist.all_reduce(total)
    return dist.get_rank(), dist.get_world_size(), total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-file", required=True)
    parser.add_argument("--torch", action="store_true", help="torch.distributed over gloo, under torchrun")
    args = parser.parse_args()
    rank, size, total = torch_sum() if args.torch else hvdplus_sum()
    done = time.time()
    torch.testing.assert_close(total, torch.arange(4.0) * size * (size + 1) / 2)
    if rank == 0:
        with open(args.time_file, "w") as handle:
            handle.write(f"{done:.6f}\n")
    if args.torch:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
