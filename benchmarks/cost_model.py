"""An alpha-beta cost model of hvdplus' all-reduce algorithms on hosts joined by a network.

    python benchmarks/cost_model.py --hosts 2 16 64 256 1024 --per-host 8 --gbps 100 --mib 256

A message of m bytes over a link costs `alpha + m * beta`; reducing m bytes costs
`m * gamma`. A host sends over one link of its own (beta_cross seconds per byte, shared by
all of its ranks that send at once); ranks on one host exchange through shared memory
(beta_local). benchmarks/multihost.py measures these constants on real links and compares
every algorithm's measured time with what this model predicts; with constants of a real
cluster, the same model predicts what each algorithm takes on thousands of nodes.

Ranks are numbered host by host, as hvdplusrun places them. For n bytes on H hosts of L
ranks each (p = H * L):

- ring: 2(p - 1) steps, each moving n/p bytes from every rank to the next. In each step
  exactly one rank per host sends across (to the next host), so no link is shared:
  2(p - 1)(alpha_cross + n/p * beta_cross), and the p - 1 reducing steps reduce n/p bytes
  each while the next piece travels (the ring is pipelined), so each such step costs the
  larger of sending and reducing.
- hierarchical: a reduce-scatter inside each host, (L - 1)/L * n through shared memory
  and reduced; an all-reduce of each rank's n/L shard across hosts, 2(H - 1) steps in
  which the L ranks of a host send n/(L H) bytes each over the one link, so n/H per host
  per step; and an all-gather inside each host, (L - 1)/L * n again. It sends n(H - 1)/H
  * 2 bytes per host across the network against the ring's 2(p - 1)/p * n: on 2 hosts of 2
  ranks, n against 1.5 n, which caps its gain over the ring at 1.5x there.
"""

import argparse
from dataclasses import dataclass

__all__ = ["Links", "ring_seconds", "hierarchical_seconds", "PREDICTORS"]


@dataclass(frozen=True)
class Links:
    """The model's constants, in seconds and seconds per byte."""

    alpha_cross: float  # latency of one message between hosts
    beta_cross: float  # per byte through one host's network link
    alpha_local: float  # latency of one message inside a host
    beta_local: float  # per byte copied between ranks of one host
    gamma: float  # per byte reduced (one elementwise sum of float32)


def ring_seconds(nbytes: float, hosts: int, per_host: int, links: Links) -> float:
    ranks = hosts * per_host
    if ranks == 1:
        return 0.0
    piece = nbytes / ranks
    alpha, beta = (links.alpha_cross, links.beta_cross) if hosts > 1 else (links.alpha_local, links.beta_local)
    send = alpha + piece * beta
    return (ranks - 1) * max(send, piece * links.gamma) + (ranks - 1) * send


def hierarchical_seconds(nbytes: float, hosts: int, per_host: int, links: Links) -> float:
    local = 0.0
    if per_host > 1:
        moved = (per_host - 1) / per_host * nbytes
        # reduce-scatter (copy and reduce) then all-gather (copy) inside the host
        local = 2 * (per_host - 1) * links.alpha_local + moved * (2 * links.beta_local + links.gamma)
    cross = 0.0
    if hosts > 1:
        step = nbytes / hosts  # what each host sends per step, over its one link
        shard_piece = nbytes / (per_host * hosts)  # what each rank reduces per step
        send = links.alpha_cross + step * links.beta_cross
        cross = (hosts - 1) * max(send, shard_piece * links.gamma) + (hosts - 1) * send
    return local + cross


PREDICTORS = {"ring": ring_seconds, "hierarchical": hierarchical_seconds}


def bus_bandwidth(nbytes: float, seconds: float, ranks: int) -> float:
    """Bytes per second as nccl-tests define bus bandwidth: algbw * 2(p-1)/p."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks if seconds else float("inf")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 16, 64, 256, 1024])
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--gbps", type=float, default=100.0, help="each host's link, Gbit/s")
    parser.add_argument("--alpha-us", type=float, default=5.0, help="latency between hosts, microseconds")
    parser.add_argument("--local-gbps", type=float, default=80.0, help="copies between ranks of a host, Gbit/s")
    parser.add_argument("--reduce-gbps", type=float, default=80.0, help="elementwise sums, Gbit/s of input")
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 64, 256])
    args = parser.parse_args()
    links = Links(alpha_cross=args.alpha_us * 1e-6, beta_cross=8 / (args.gbps * 1e9), alpha_local=1e-6,
                  beta_local=8 / (args.local_gbps * 1e9), gamma=8 / (args.reduce_gbps * 1e9))
    print(f"{'hosts':>6s} {'ranks':>7s} {'MiB':>6s} {'ring s':>10s} {'hier s':>10s} {'hier/ring':>9s} "
          f"{'ring busbw GB/s':>16s} {'hier busbw GB/s':>16s}")
    for hosts in args.hosts:
        ranks = hosts * args.per_host
        for mib in args.mib:
            nbytes = mib * 2**20
            ring = ring_seconds(nbytes, hosts, args.per_host, links)
            hierarchical = hierarchical_seconds(nbytes, hosts, args.per_host, links)
            print(f"{hosts:6d} {ranks:7d} {mib:6g} {ring:10.4f} {hierarchical:10.4f} {ring / hierarchical:9.2f} "
                  f"{bus_bandwidth(nbytes, ring, ranks) / 1e9:16.2f} "
                  f"{bus_bandwidth(nbytes, hierarchical, ranks) / 1e9:16.2f}")


if __name__ == "__main__":
    main()
