"""Every tunable of hvdplus, declared once, and read once from the environment into one frozen
`Settings`.

Each `Setting` below names its variable, how its text is read, its default and what it means;
`hvdplusrun`'s tuning flags (hvdplus.runner.tuning) and the tables of docs/configuration.md
(written by docs/hooks/settings_tables.py when the site is built) come from the same
declarations. The launcher turns its flags into these variables, so a job started by plain
`mpirun` is configured the same way. Each `HVDPLUS_*` name also accepts the `HOROVOD_*` spelling
that existing job scripts already export.
"""

import argparse
import dataclasses
import os
from typing import Any, Callable, Mapping, Optional, Tuple

__all__ = ["Settings", "Setting", "LauncherFlag", "SETTINGS", "ALLREDUCE_ALGORITHMS", "OVERLAP_MODES", "env_names",
           "overlaps_compute"]

ALLREDUCE_ALGORITHMS = ("auto", "mpi", "ring", "hierarchical", "shm")
OVERLAP_MODES = ("auto", "on", "off")

MIB = 1024 * 1024
_OFF = ("0", "false", "no", "off")


def env_names(suffix: str):
    """The variable names that configure `suffix`, ours first."""
    return ("HVDPLUS_" + suffix, "HOROVOD_" + suffix)


# -- how a variable's text is read (each raises ValueError saying what it expected) -----------
def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("is not a valid int") from None


def _decimal(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a valid float") from None


def _positive_integer(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise ValueError(f"must be positive, got {value}")
    return value


def _switch(text: str) -> bool:
    return text.strip().lower() not in _OFF


def _yes(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _text(text: str) -> str:
    return text


def _choice(choices: Tuple[str, ...], spellings: Mapping[str, str] = None) -> Callable[[str], str]:
    def read(text: str) -> str:
        value = text.strip().lower()
        value = (spellings or {}).get(value, value)
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return read


# -- how a launcher flag's value is checked and written for the ranks -------------------------
def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
    return int(text)


def _signal_names(text: str) -> Tuple[str, ...]:
    """"USR1,TERM" (or "SIGUSR1 SIGTERM", "none") as signal names ("SIGUSR1", "SIGTERM")."""
    import signal

    if text.strip().lower() == "none":
        return ()
    names = []
    for word in text.replace(",", " ").split():
        name = word.upper() if word.upper().startswith("SIG") else "SIG" + word.upper()
        if not isinstance(getattr(signal, name, None), signal.Signals) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"expects signal names such as USR1,TERM (or none); {word!r} is not one to catch")
        names.append(name)
    return tuple(names)


def _shortest(value: float) -> str:
    return format(value, "g")


@dataclasses.dataclass(frozen=True)
class LauncherFlag:
    """The `hvdplusrun` flag that sets a variable: its spelling, how its value becomes the
    variable's text, and its argparse options."""

    spelling: str
    to_env: Callable[[Any], str]
    options: Mapping[str, Any]
    shown: str = ""  # how docs write it, with its value (`--cycle-time-ms MS`); the spelling when empty


@dataclasses.dataclass(frozen=True)
class Setting:
    """One tunable.

    Args:
        field: its attribute of `Settings`.
        variable: the variable's name after `HVDPLUS_` (and `HOROVOD_`); a full name when
            `spelled_out`.
        read: the variable's text into the value; raises ValueError saying what it expected.
        default: the value when the variable is unset or empty.
        meaning: what it does, for docs/configuration.md.
        section: the docs table it belongs in ("engine", "topology" or "elastic").
        shown_default: how the docs write the default; `default` when empty.
        flag: the launcher flag that sets it, if any.
        spelled_out: `variable` is a whole name that no prefix is added to (another program's).
        short: another name after `HVDPLUS_` that reads the same, where the long one follows
            Horovod's (`STALL_CHECK_TIME` for `STALL_CHECK_TIME_SECONDS`).
    """

    field: str
    variable: str
    read: Callable[[str], Any]
    default: Any
    meaning: str
    section: str
    shown_default: str = ""
    flag: Optional[LauncherFlag] = None
    spelled_out: bool = False
    short: str = ""

    @property
    def names(self) -> Tuple[str, ...]:
        if self.spelled_out:
            return (self.variable,)
        return env_names(self.variable) + ((f"HVDPLUS_{self.short}",) if self.short else ())

    def value(self, environ: Mapping[str, str]) -> Any:
        for name in self.names:
            text = environ.get(name)
            if text not in (None, ""):
                try:
                    return self.read(text)
                except ValueError as error:
                    raise ValueError(f"{self.names[0]}={text!r} {error}") from None
        return self.default


def _flag(spelling: str, to_env: Callable[[Any], str], shown: str = "", **options) -> LauncherFlag:
    return LauncherFlag(spelling, to_env, options, shown)


SETTINGS = (
    # The engine and its algorithms.
    Setting("fusion_threshold_bytes", "FUSION_THRESHOLD", _integer, 64 * MIB,
            "largest fused all-reduce, in bytes (the flag takes MiB)", "engine", "67108864 (64 MiB)",
            _flag("--fusion-threshold-mb", lambda mb: str(int(mb * MIB)), "--fusion-threshold-mb MB",
                  type=_non_negative, metavar="MB", help="fuse tensors into buffers of up to MB MiB")),
    Setting("cycle_time_ms", "CYCLE_TIME", _decimal, 1.0,
            "the engine thread's cycle while work is in flight, in milliseconds", "engine", "1",
            _flag("--cycle-time-ms", _shortest, "--cycle-time-ms MS",
                  type=_non_negative, metavar="MS", help="milliseconds between negotiation cycles")),
    Setting("cache_capacity", "CACHE_CAPACITY", _integer, 1024,
            "names the response cache holds; 0 turns it off", "engine", "",
            _flag("--cache-capacity", str, "--cache-capacity N",
                  type=_count, metavar="N", help="collectives whose negotiation is cached (0: none)")),
    Setting("timeline_path", "TIMELINE", _text, None,
            "write a Chrome-trace timeline to this path (rank 0)", "engine", "unset",
            _flag("--timeline-filename", os.path.abspath, "--timeline-filename PATH",
                  metavar="PATH", help="write a Chrome-trace timeline of collectives to PATH")),
    Setting("timeline_mark_cycles", "TIMELINE_MARK_CYCLES", _switch, False,
            "any value but `0`, `false`, `no`, `off` marks each engine cycle that runs collectives with a "
            "`CYCLE_START` instant event in the timeline", "engine", "off",
            _flag("--timeline-mark-cycles", lambda _: "1", action="store_true", default=None,
                  help="mark each engine cycle that runs collectives in the timeline")),
    Setting("allreduce_algorithm", "ALLREDUCE_ALGO", _choice(ALLREDUCE_ALGORITHMS), "auto",
            "`auto`, `mpi`, `ring`, `hierarchical` or `shm` ([algorithms](algorithms.md))", "engine", "`auto`",
            _flag("--allreduce-algo", str, "--allreduce-algo NAME",
                  choices=ALLREDUCE_ALGORITHMS, help="allreduce algorithm (default: auto)")),
    Setting("hierarchical_allreduce", "HIERARCHICAL_ALLREDUCE", _switch, False,
            "any value but `0`, `false`, `no`, `off` means `HVDPLUS_ALLREDUCE_ALGO=hierarchical` when that is "
            "`auto`", "engine", "off",
            _flag("--hierarchical-allreduce", lambda _: "1",
                  action="store_true", default=None, help="reduce within each node, then across nodes")),
    Setting("autotune", "AUTOTUNE", _switch, False,
            "tune the fusion threshold, the cycle time and, across nodes, the all-reduce algorithm by measuring "
            "the first steps ([performance](performance.md#autotuning))", "engine", "off",
            _flag("--autotune", lambda _: "1", action="store_true", default=None,
                  help="tune fusion threshold, cycle time and (across nodes) algorithm while training")),
    Setting("autotune_log", "AUTOTUNE_LOG", _text, None,
            "the autotuner's samples and choice, as CSV (rank 0)", "engine", "unset",
            _flag("--autotune-log-file", os.path.abspath, "--autotune-log-file PATH",
                  metavar="PATH", help="write the autotuner's samples and choice to PATH as CSV")),
    Setting("autotune_warmup_samples", "AUTOTUNE_WARMUP_SAMPLES", _integer, 3,
            "samples measured and dropped before tuning starts", "engine"),
    Setting("autotune_steps_per_sample", "AUTOTUNE_STEPS_PER_SAMPLE", _integer, 10,
            "engine cycles with all-reduce work in one sample", "engine"),
    Setting("stall_check_seconds", "STALL_CHECK_TIME_SECONDS", _decimal, 60.0,
            "rank 0 warns of a collective that some ranks submitted and others have not, once it has waited this "
            "long and again each time it has waited as long again, naming the missing ranks and what they "
            "submitted instead; 0 turns the check off", "engine", "60",
            _flag("--stall-check-time-seconds", _shortest, "--stall-check-time-seconds S",
                  type=_non_negative, metavar="S", help="warn when ranks wait for each other this long"),
            short="STALL_CHECK_TIME"),
    Setting("stall_check_disable", "STALL_CHECK_DISABLE", _switch, False,
            "any value but `0`, `false`, `no`, `off` turns the stall check off, as "
            "`HVDPLUS_STALL_CHECK_TIME_SECONDS=0` does", "engine", "off",
            _flag("--no-stall-check", lambda _: "1", action="store_true", default=None,
                  help="no stall warnings and no stall shutdown")),
    Setting("stall_shutdown_seconds", "STALL_SHUTDOWN_TIME_SECONDS", _decimal, 0.0,
            "once a stalled collective has waited this long, every rank's pending operations fail with "
            "`StalledError`, naming it and its missing ranks (needs the stall check on)", "engine", "0 (never)",
            _flag("--stall-shutdown-time-seconds", _shortest, "--stall-shutdown-time-seconds S",
                  type=_non_negative, metavar="S",
                  help="fail the job's collectives after a stall this long (0: never)"),
            short="STALL_SHUTDOWN_TIME"),
    Setting("overlap", "OVERLAP", _choice(OVERLAP_MODES, {"1": "on", "true": "on", "yes": "on", "0": "off",
                                                          "false": "off", "no": "off"}), "auto",
            "`on` runs agreed collectives in the background at once; `off` holds them until a rank waits; `auto` "
            "chooses by cores per rank ([design](design.md#overlap-or-not)); also `1`/`true`/`yes` and "
            "`0`/`false`/`no`", "engine", "`auto`"),
    Setting("single_copy", "SINGLE_COPY", _switch, True,
            "`0` (or `false`, `no`, `off`) stops reading peers' memory directly (`process_vm_readv`) inside a "
            "node", "engine", "on"),
    # Where the ranks are.
    Setting("node_id", "NODE_ID", _text, None,
            "pretend this process is on the node with this id (any string)", "topology", "unset"),
    Setting("ranks_per_node", "RANKS_PER_NODE", _positive_integer, 0,
            "pretend blocks of k consecutive ranks are nodes", "topology", "0 (off)"),
    # Elastic jobs.
    Setting("elastic_dir", "ELASTIC_DIR", _text, None,
            "the folder the launcher keeps for the job across its launches, where it announces added slots; the "
            "same path followed by `commits` is where each host keeps its copy of the commits; unset, commits "
            "stay in memory and a job that would have to restart ends with an error", "elastic", "unset",
            _flag("any elastic flag", str)),
    Setting("elastic_in_place", "ELASTIC_IN_PLACE", _switch, True,
            "where MPI lets the ranks outlive a dead one, re-form the job on the survivors; `0` (or `false`, "
            "`no`, `off`) ends it for the launcher to restart instead", "elastic", "on",
            _flag("--no-in-place", lambda _: "0", "`--no-in-place` sets `0`")),
    Setting("elastic_min_np", "ELASTIC_MIN_NP", _integer, 1,
            "fewest ranks that go on in place; fewer survivors end the job for a restart", "elastic", "",
            _flag("--min-np", str, "--min-np N")),
    Setting("elastic_generation", "ELASTIC_GENERATION", _integer, 0,
            "which announcement of new slots this launch began with; set by the launcher, not by hand", "elastic"),
    Setting("commit_dir", "COMMIT_DIR", _text, None,
            "a folder that every host shares (and a requeued or later job sees): rank 0 also writes each commit "
            "of `hvd.elastic.run`'s state there, atomically, and a job started with the same folder resumes from "
            "its newest commit ([Slurm](slurm.md#preemption-and-time-limits))", "elastic", "unset",
            _flag("--commit-dir", os.path.abspath, "--commit-dir PATH", metavar="PATH",
                  help="also write every commit to PATH (shared storage) and resume from it")),
    Setting("stop_signals", "STOP_SIGNALS", _signal_names, ("SIGUSR1", "SIGTERM"),
            "signals that ask `hvd.elastic.run` to stop: every rank stops at the same commit, after writing it, "
            "and inside a Slurm job asks Slurm to requeue the job; `none` for no such signals", "elastic",
            "`USR1,TERM`",
            _flag("--stop-signals", str, "--stop-signals LIST", metavar="LIST",
                  help="signals that stop every rank at its next commit (default USR1,TERM)")),
    Setting("requeue", "REQUEUE", _switch, True,
            "`0` (or `false`, `no`, `off`): after a stop signal, do not ask Slurm to requeue the job", "elastic",
            "on",
            _flag("--no-requeue", lambda _: "0", "--no-requeue", action="store_true", default=None,
                  help="after a stop signal, end without asking Slurm to requeue the job")),
    Setting("max_requeues", "MAX_REQUEUES", _integer, 20,
            "ask Slurm to requeue a stopped job only while its `SLURM_RESTART_COUNT` is below this", "elastic", "",
            _flag("--max-requeues", str, "--max-requeues N", type=_count, metavar="N",
                  help="requeue a stopped Slurm job at most N times (default 20)")),
    Setting("ulfm", "OMPI_MCA_mpi_ft_enable", _yes, False,
            "`1`, `true`, `yes` or `on`: Open MPI lets the ranks outlive a dead one (ULFM), so an elastic job "
            "re-forms in place", "elastic", "unset",
            _flag("(Open MPI's `mpirun --with-ft ulfm`)", str), spelled_out=True),
)


def _from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
    values = {setting.field: setting.value(environ) for setting in SETTINGS}
    if values["hierarchical_allreduce"] and values["allreduce_algorithm"] == "auto":
        values["allreduce_algorithm"] = "hierarchical"
    if values["stall_check_disable"]:
        values["stall_check_seconds"] = 0.0
    return cls(**values)


Settings = dataclasses.make_dataclass(
    "Settings", [(setting.field, Any, dataclasses.field(default=setting.default)) for setting in SETTINGS],
    frozen=True,
    namespace={
        "__doc__": "Configuration of one process: one attribute per declaration in SETTINGS.",
        "from_env": classmethod(_from_env),
        # Whether the survivors of a dead rank re-form the job in place: MPI lets them outlive it
        # (Open MPI started with `--with-ft ulfm`, which hvdplusrun passes to elastic jobs), and
        # HVDPLUS_ELASTIC_IN_PLACE does not leave it to the launcher to restart the job instead.
        "in_place_recovery": property(lambda self: self.ulfm and self.elastic_in_place),
    },
)

Settings.__module__ = __name__


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
