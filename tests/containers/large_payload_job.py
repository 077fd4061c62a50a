"""Calls hvdplus.run with a large argument, and has every rank return as large a result: the
ranks' results must equal the argument with their rank mixed in, byte for byte. Run on this
machine (tests/test_run_function.py) and from the first of several containers, which share no
file system (tests/test_containers.py). Prints one JSON line: the hosts of the ranks, in rank
order, and the seconds the call took.

    large_payload_job.py NRANKS MEGABYTES [HOSTS]
"""

import json
import sys
import time

import numpy as np

import hvdplus


def mix_in_rank(data):
    import socket

    import numpy as np

    import hvdplus as hvd
    hvd.init()
    # Every rank holds the same argument: its checksum agrees with rank 0's.
    checksum = np.array([int(data[::4096].sum())], dtype=np.int64)
    assert hvd.broadcast(checksum, root_rank=0)[0] == checksum[0], "the ranks' arguments differ"
    return socket.gethostname(), data ^ np.uint8(hvd.rank() + 1)


if __name__ == "__main__":
    nranks, megabytes = int(sys.argv[1]), int(sys.argv[2])
    hosts = sys.argv[3] if len(sys.argv) > 3 else None
    data = np.random.default_rng(0).integers(0, 256, megabytes * 1_000_000, dtype=np.uint8)
    started = time.monotonic()
    results = hvdplus.run(mix_in_rank, args=(data,), np=nranks, hosts=hosts)
    seconds = time.monotonic() - started
    for rank, (_, returned) in enumerate(results):
        assert returned.shape == data.shape and np.array_equal(returned ^ np.uint8(rank + 1), data), rank
    print(json.dumps({"hosts": [host for host, _ in results], "seconds": round(seconds, 2)}), flush=True)
