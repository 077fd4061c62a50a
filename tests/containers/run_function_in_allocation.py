"""For tests/test_slurm.py, under `salloc`: hvdplus.run with no np and no hosts, which must
take the allocation's; prints the allocation's node list, then the ranks' return values, in
order, as one JSON line."""

import json
import os

import hvdplus


def rank_and_sum(scale):
    import socket

    import numpy as np

    import hvdplus as hvd

    hvd.init()
    total = hvd.allreduce(np.arange(3.0) * (hvd.rank() + 1) * scale, op=hvd.Sum, name="sum")
    return hvd.rank(), hvd.size(), socket.gethostname(), total.tolist()


print("allocation", os.environ["SLURM_JOB_NODELIST"], flush=True)
print(json.dumps(hvdplus.run(rank_and_sum, args=(2.0,))), flush=True)
