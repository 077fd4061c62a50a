"""Every tunable of hvdplus, read once from the environment into one frozen object.

The launcher (`hvdplusrun`) turns its flags into these environment variables, so a job
started by plain `mpirun` is configured the same way. Each `HVDPLUS_*` name also
accepts the `HOROVOD_*` spelling that existing job scripts already export.
"""

import dataclasses
import os
from typing import Mapping, Optional

__all__ = ["Settings", "ALLREDUCE_ALGORITHMS", "OVERLAP_MODES", "env_names", "overlaps_compute"]

ALLREDUCE_ALGORITHMS = ("auto", "mpi", "ring", "hierarchical", "shm")
OVERLAP_MODES = ("auto", "on", "off")

MIB = 1024 * 1024


def env_names(suffix: str):
    """The variable names that configure `suffix`, ours first."""
    return ("HVDPLUS_" + suffix, "HOROVOD_" + suffix)


def _lookup(environ: Mapping[str, str], suffix: str) -> Optional[str]:
    for name in env_names(suffix):
        value = environ.get(name)
        if value not in (None, ""):
            return value
    return None


def _number(environ, suffix, default, kind=float):
    raw = _lookup(environ, suffix)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(
            f"{env_names(suffix)[0]}={raw!r} is not a valid {kind.__name__}"
        ) from None


def _flag(environ, suffix) -> bool:
    raw = _lookup(environ, suffix)
    return raw is not None and raw.strip().lower() not in ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Configuration of one process; every variable is described in docs/configuration.md."""

    fusion_threshold_bytes: int = 64 * MIB
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    timeline_path: Optional[str] = None
    allreduce_algorithm: str = "auto"
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float = 0.0
    node_id: Optional[str] = None
    ranks_per_node: int = 0
    overlap: str = "auto"
    single_copy: bool = True
    elastic_dir: Optional[str] = None
    ulfm: bool = False
    in_place_recovery: bool = False
    elastic_min_np: int = 1
    autotune: bool = False
    autotune_log: Optional[str] = None
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
        algorithm = (_lookup(environ, "ALLREDUCE_ALGO") or "auto").lower()
        if _flag(environ, "HIERARCHICAL_ALLREDUCE") and algorithm == "auto":
            algorithm = "hierarchical"
        if algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(
                f"HVDPLUS_ALLREDUCE_ALGO={algorithm!r}; expected one of {', '.join(ALLREDUCE_ALGORITHMS)}"
            )
        ranks_per_node = _number(environ, "RANKS_PER_NODE", 0, int)
        if ranks_per_node < 0:
            raise ValueError(f"HVDPLUS_RANKS_PER_NODE must be positive, got {ranks_per_node}")
        overlap = (_lookup(environ, "OVERLAP") or "auto").strip().lower()
        overlap = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(overlap, overlap)
        if overlap not in OVERLAP_MODES:
            raise ValueError(f"HVDPLUS_OVERLAP={overlap!r}; expected one of {', '.join(OVERLAP_MODES)}")
        return cls(
            fusion_threshold_bytes=_number(environ, "FUSION_THRESHOLD", cls.fusion_threshold_bytes, int),
            cycle_time_ms=_number(environ, "CYCLE_TIME", cls.cycle_time_ms),
            cache_capacity=_number(environ, "CACHE_CAPACITY", cls.cache_capacity, int),
            timeline_path=_lookup(environ, "TIMELINE"),
            allreduce_algorithm=algorithm,
            stall_check_seconds=_number(environ, "STALL_CHECK_TIME_SECONDS", cls.stall_check_seconds),
            stall_shutdown_seconds=_number(environ, "STALL_SHUTDOWN_TIME_SECONDS", cls.stall_shutdown_seconds),
            node_id=_lookup(environ, "NODE_ID"),
            ranks_per_node=ranks_per_node,
            overlap=overlap,
            single_copy=_lookup(environ, "SINGLE_COPY") is None or _flag(environ, "SINGLE_COPY"),
            elastic_dir=_lookup(environ, "ELASTIC_DIR"),
            elastic_min_np=_number(environ, "ELASTIC_MIN_NP", cls.elastic_min_np, int),
            autotune=_flag(environ, "AUTOTUNE"),
            autotune_log=_lookup(environ, "AUTOTUNE_LOG"),
            autotune_warmup_samples=_number(environ, "AUTOTUNE_WARMUP_SAMPLES", cls.autotune_warmup_samples, int),
            autotune_steps_per_sample=_number(environ, "AUTOTUNE_STEPS_PER_SAMPLE", cls.autotune_steps_per_sample,
                                              int),
            ulfm=_ulfm(environ),
            in_place_recovery=_ulfm(environ) and (
                _lookup(environ, "ELASTIC_IN_PLACE") is None or _flag(environ, "ELASTIC_IN_PLACE")),
        )


def _ulfm(environ: Mapping[str, str]) -> bool:
    """Whether MPI lets the ranks outlive a dead one: Open MPI started with `--with-ft ulfm`
    (which `hvdplusrun` passes to elastic jobs). The survivors then re-form the job in
    place, unless HVDPLUS_ELASTIC_IN_PLACE=0 asks the launcher to restart it instead."""
    return environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in ("1", "true", "yes", "on")


def overlaps_compute(mode: str, ranks_on_node: int, cores: Optional[int] = None) -> bool:
    """Whether collectives should run in the background while the training loop computes.

    That pays only when the node has a core to spare for each rank's engine thread (GPU
    training, or fewer ranks than cores). Where every core already trains, work done in the
    background is time-shared with the compute it was meant to hide behind, and a rank that
    waits in the background for a slower peer steals its own core; there hvdplus holds agreed
    collectives until some rank waits for one, and runs them then, with the cores free."""
    if mode != "auto":
        return mode == "on"
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores >= 2 * ranks_on_node
