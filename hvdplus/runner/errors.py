"""Errors that stop `hvdplusrun` before a job starts; each message says what to change."""

__all__ = ["LaunchError", "MpiNotFoundError"]


class LaunchError(Exception):
    """The command line or the environment cannot make a job; printed without a traceback."""


class MpiNotFoundError(LaunchError):
    """No usable `mpirun`/`mpiexec` was found, or the one named is not an MPI launcher."""
