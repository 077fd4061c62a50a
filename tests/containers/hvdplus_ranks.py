"""For tests/test_slurm.py: hvd.init(), then one all-reduce through hvdplus; each rank adds
arange(4) * (rank + 1) and prints a JSON line with its rank, size, local rank and size, host,
the Slurm task id it was given (SLURM_PROCID, if any) and the sum it got."""

import json
import os
import socket

import numpy as np

import hvdplus as hvd

hvd.init()
total = hvd.allreduce(np.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum, name="ranks")
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                  "local_size": hvd.local_size(), "host": socket.gethostname(),
                  "procid": os.environ.get("SLURM_PROCID"), "sum": total.tolist()}), flush=True)
