"""Transport on numpy buffers over an explicit communicator.

MPI wrappers, the ring and hierarchical algorithms, the node's shared-memory window, the
single-copy reads of peers' memory, reduction kernels, topology and the choice among them
(`algorithms.CollectiveAlgorithms`). Callers hand in checked, agreed buffers: argument
checks and the agreement across ranks belong to `hvdplus.engine`.
"""
