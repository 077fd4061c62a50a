"""400 steps of four all-reduces each, checked against the exact sums, under the autotuner
(HOROVOD_AUTOTUNE and friends in the environment); each rank then prints 'tuned <rank>
<algorithm>'. tests/test_autotune.py runs it with one rank per (posed) node and checks that
the sums stay exact while the tuner moves every rank's algorithm, and that all end on one."""

import numpy as np

import hvdplus as hvd
from hvdplus.core import runtime

hvd.init()
engine = runtime.current().engine
for step in range(400):
    values = [np.full(20000 + i, hvd.rank() + step + i, np.float64) for i in range(4)]
    handles = [hvd.allreduce_async(value, op=hvd.Sum, name=f"g{i}") for i, value in enumerate(values)]
    for i, handle in enumerate(handles):
        want = sum(r + step + i for r in range(hvd.size()))
        assert (hvd.synchronize(handle) == want).all(), (step, i)
assert hvd.rank() != 0 or engine.tuned_setting() is not None
print("tuned", hvd.rank(), engine.algorithms.algorithm, flush=True)
