"""Runs pytest in one rank of a job with the rank's whole output in a file of its own:

    python tests/testkit/rank_pytest.py DIR [pytest arguments]

The output moves to DIR/rank-N.log before pytest starts, so pytest's own capturing, which
saves and restores the standard streams, keeps it there. The job's standard output stays
open for one closing line per rank (testkit.rank_reports), under HVDPLUS_RANK_STDOUT_FD.
"""

import os
import sys

__all__ = ["env_rank", "rank_log"]


def env_rank() -> int:
    """This process's rank as its launcher sets it (Open MPI, MPICH's hydra, Slurm), read
    before MPI starts."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def rank_log(folder, rank) -> str:
    return os.path.join(folder, f"rank-{rank}.log")


def main():
    folder, pytest_args = sys.argv[1], sys.argv[2:]
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["HVDPLUS_RANK_STDOUT_FD"] = str(os.dup(1))
    log = os.open(rank_log(folder, env_rank()), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    import pytest

    # A rank stuck inside an MPI call never returns to Python, so its timeout is a thread's
    # (which ends the rank), not the signal the one-process suite uses.
    sys.exit(pytest.main(["--rank-report-dir", folder, "-o", "timeout_method=thread", *pytest_args]))


if __name__ == "__main__":
    main()
