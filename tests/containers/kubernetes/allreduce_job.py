"""The training program of tests/test_kubernetes.py's pods (mounted as /workspace/train.py):
one hvdplus all-reduce, each rank adding arange(4) * (rank + 1); every rank prints a JSON line
with its rank, the job's size, its host and the sum it got, which the test checks against numpy."""

import json
import socket

import numpy as np

import hvdplus as hvd

hvd.init()
total = hvd.allreduce(np.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum, name="kubernetes.sum")
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(), "sum": total.tolist()}),
      flush=True)
hvd.shutdown()
