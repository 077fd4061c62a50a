"""Waiting for a late peer, measured: how much longer a rank waited, and how much more
processor time its whole process took meanwhile (every thread: the engine thread too), than
the same operation with nobody late, measured in the same run.

A rank that waits should leave the core to others, above all to the peer it waits for where
ranks outnumber cores. The in-rank suites hold every wait of hvdplus (the communication
layer's, the engine's, point-to-point) to CPU_SHARE_LIMIT of a core over a LATE_S wait. The
operation's own work (moving and reducing the data, which MPI's spinning waits do once every
rank is there, and which takes tens of milliseconds where three ranks share two cores) is in
both measurements, so it does not count as waiting.
"""

import statistics
import time

__all__ = ["LATE_S", "CPU_SHARE_LIMIT", "wait_for_late_peer", "check_share"]

# How late the last rank arrives.
LATE_S = 0.5
# A quiet machine measures 1-2.5 % for the communication layer's and point-to-point waits and
# 2-3 % for the engine's (two threads look: the caller for 5 ms, then the engine thread), at 2 to
# 4 ranks on Open MPI and at 3 on MPICH. Each look that wakes a sleeping thread costs 40-90 us of
# processor time on these machines, whatever it does, so the share is mostly the number of looks.
# The limit is far above the highest quiet share (3.6 %, the engine at 3 ranks) and far below a
# spinning wait's (all of a core): beside the suite's other worker, with 3 ranks on 2 cores, the
# layer's 4 MiB wait measured 6.1 % and 10.2 %. The benchmark (benchmarks/waiting.py) tracks the
# share itself; the tests catch a wait that spins.
CPU_SHARE_LIMIT = 0.15
# Rounds with nobody late, whose median is the operation's own cost.
ON_TIME_ROUNDS = 3


def _timed(wait, barrier, sleep_s: float):
    barrier()
    if sleep_s:
        time.sleep(sleep_s)
    wall, cpu = time.monotonic(), time.process_time()
    wait()
    return time.monotonic() - wall, time.process_time() - cpu


def wait_for_late_peer(wait, barrier, late: bool):
    """(extra wall seconds, extra processor seconds) of `wait()` on this rank when the `late`
    rank sleeps LATE_S after `barrier()`, over the median of ON_TIME_ROUNDS rounds with nobody
    late. Every rank calls it, with the same `wait` and `barrier`."""
    on_time = [_timed(wait, barrier, 0.0) for _ in range(ON_TIME_ROUNDS)]
    waited, cpu = _timed(wait, barrier, LATE_S if late else 0.0)
    return (waited - statistics.median(wall for wall, _ in on_time),
            cpu - statistics.median(cpu for _, cpu in on_time))


def check_share(waited: float, cpu: float, what: str) -> None:
    """The waiting rank waited most of LATE_S, on CPU_SHARE_LIMIT of a core at most."""
    assert waited >= 0.8 * LATE_S, f"{what}: waited only {waited:.3f} s for a peer {LATE_S} s late"
    print(f"{what}: waiting {waited:.3f} s took {100 * cpu / waited:.2f} % of a core")  # in the rank's log
    assert cpu < CPU_SHARE_LIMIT * waited, (
        f"{what}: waiting {waited:.3f} s took {cpu:.3f} s more processor time than with nobody late "
        f"({100 * cpu / waited:.1f} % of a core; limit {100 * CPU_SHARE_LIMIT:.0f} %)")
