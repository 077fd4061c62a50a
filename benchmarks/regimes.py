"""Training regimes over rate-limited links between hosts: synchronous data parallelism,
local SGD (H = 4, 16), DiLoCo (H = 50) and staleness=1 in hvdplus, beside torch's DDP and its
post-local SGD (PostLocalSGDOptimizer, H = 4, 16) on gloo, in the same containers.

    python benchmarks/regimes.py [--gbit 1 0.1] [--accuracy-steps 160] [--csv PATH]

As root with podman: two hosts, one rank each, every link limited to each rate in turn
(benchmarks/linked_hosts.py); each regime's throughput over whole averaging periods and the
bytes the hosts put on the wire per sample (benchmarks/links_job.py); then, over the first
rate's links, each regime trains --accuracy-steps steps from the same start on
scikit-learn's digits and the ranks' averaged model is tested on held-out digits. It prints
the goals (at the slowest rate, local SGD with H = 16 at least 5x the synchronous throughput
and at least torch's post-local SGD; every regime's accuracy within 1 point of synchronous)
and writes benchmarks/results/regimes_np2.csv.

Hierarchical averaging (within a host every step, across hosts every H) is not built yet.
"""

from linked_hosts import by_way, link_name, main, print_accuracy_goal

REGIMES = ["synchronous", "local SGD H=4", "local SGD H=16", "DiLoCo H=50", "staleness=1", "torch DDP",
           "torch post-local SGD H=4", "torch post-local SGD H=16"]


def check_goals(rows, slowest):
    speed = by_way(rows, "throughput", "samples_per_s", slowest)
    fast = speed["local SGD H=16"]
    print(f"\nat {link_name(slowest)}: local SGD H=16 over synchronous {fast / speed['synchronous']:.2f}x (goal at "
          f"least 5x), over torch's post-local SGD H=16 {fast / speed['torch post-local SGD H=16']:.2f}x "
          "(goal at least 1x)")
    print_accuracy_goal(rows)


if __name__ == "__main__":
    main("regimes", __doc__.splitlines()[0], REGIMES, check_goals)
