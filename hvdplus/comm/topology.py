"""Which ranks share a node: the node (local) communicator and the cross-node communicator.

Ranks on one host are found with `Split_type(COMM_TYPE_SHARED)`. For tests on one machine,
`HVDPLUS_NODE_ID` (any string per process) or `HVDPLUS_RANKS_PER_NODE=k` (blocks of k
consecutive ranks) make ranks pose as separate nodes, so hierarchical code paths run here.
"""

import dataclasses

from mpi4py import MPI

from ..common.settings import Settings

__all__ = ["Topology", "build_topology"]


@dataclasses.dataclass
class Topology:
    """A rank's place in the job. Communicators are owned here and freed by `free()`."""

    comm: "MPI.Intracomm"
    local_comm: "MPI.Intracomm"
    cross_comm: "MPI.Intracomm"
    homogeneous: bool

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def free(self) -> None:
        for communicator in (self.cross_comm, self.local_comm, self.comm):
            if communicator != MPI.COMM_NULL:
                communicator.Free()


def _node_comm(comm: "MPI.Intracomm", settings: Settings) -> "MPI.Intracomm":
    rank = comm.Get_rank()
    if settings.ranks_per_node:
        return comm.Split(color=rank // settings.ranks_per_node, key=rank)
    if settings.node_id is not None:
        # Colors must be integers that agree across ranks: number the distinct ids.
        ids = comm.allgather(settings.node_id)
        color = sorted(set(ids)).index(settings.node_id)
        return comm.Split(color=color, key=rank)
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)


def build_topology(comm: "MPI.Intracomm", settings: Settings) -> Topology:
    """Split `comm` (which the Topology then owns) into node and cross-node communicators."""
    local_comm = _node_comm(comm, settings)
    cross_comm = comm.Split(color=local_comm.Get_rank(), key=comm.Get_rank())
    local_sizes = comm.allgather(local_comm.Get_size())
    return Topology(
        comm=comm,
        local_comm=local_comm,
        cross_comm=cross_comm,
        homogeneous=len(set(local_sizes)) == 1,
    )
