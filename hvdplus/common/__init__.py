"""Framework-free core of hvdplus: runtime state, topology, settings and errors."""
