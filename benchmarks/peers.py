"""Starting the peers hvdplus is measured against, inside the same MPI job."""

import socket

__all__ = ["init_gloo"]


def init_gloo(comm):
    """torch.distributed over gloo on loopback, one process per rank of `comm`.

    Returns the `torch.distributed` module, or None when torch is not installed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist
