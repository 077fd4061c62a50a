"""The engine: runtime state, the background thread that negotiates, fuses and runs every
collective in the same order on all ranks, and the numpy API on top of it
(`hvdplus.engine.collectives`), which the framework adapters call."""
