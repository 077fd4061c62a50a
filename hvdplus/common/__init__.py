"""The vocabulary every layer of hvdplus shares: errors, reduce ops, dtypes, settings,
compression and build queries. Nothing here starts MPI or imports another hvdplus layer."""
