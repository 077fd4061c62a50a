"""Starts hvdplus and prints '<rank> <size>'. tests/test_runtime.py runs it in plain python (a
job of one), under hvdplusrun and under a bare mpirun."""

import hvdplus as hvd

hvd.init()
print(hvd.rank(), hvd.size())
