"""The single communication layer: collectives on numpy arrays, shared by every adapter.

Nothing here imports a deep-learning framework; adapters hand in numpy views of their
tensors' memory. `collectives` checks arguments across ranks and then calls an algorithm
module such as `mpi_collectives`, which trusts its inputs.
"""
