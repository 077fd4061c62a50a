"""The mpirun command line for a job, in the dialect of the MPI that runs it.

Each MPI gets one `Dialect` subclass that spells every part of a job (process count,
placement, output, environment); `Dialect.command` puts the parts in one order for all.
"""

import abc
import dataclasses
import os
import re
import shlex
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Type

from .errors import LaunchError
from .hosts import Host, format_host_list, hydra_hostfile_text, total_slots
from .mpi_discovery import MpiImplementation
from .rank_output import MARKER_PATTERN

__all__ = [
    "Job",
    "Dialect",
    "OpenMpi",
    "Mpich",
    "IntelMpi",
    "DIALECTS",
    "dialect_for",
    "forwarded_env_names",
    "guarded_command",
    "needs_oversubscribe",
    "local_core_count",
]

# Variables a rank on another node needs from the launching shell.
FORWARDED_PREFIXES = ("HVDPLUS_", "HOROVOD_", "PYTHON", "NCCL_", "KERAS_", "TF_", "OMP_")
FORWARDED_NAMES = ("CUDA_VISIBLE_DEVICES", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")


@dataclasses.dataclass(frozen=True)
class Job:
    """What to launch, with every decision already made; dialects only spell it.

    Args:
        num_proc: number of ranks.
        program: the command every rank runs.
        hosts: where ranks go (from -H, or parsed from the hostfile); empty for this machine.
        hostfile: a hostfile the launcher can read, in its own format; overrides `hosts`.
        oversubscribe: allow more ranks than slots.
        as_root: the launcher runs as root.
        output_dir: directory for one output file per rank, or None for the console only.
        env_names: variables to forward to every rank.
        mpi_args: extra launcher arguments, placed after ours so they win.
        fault_tolerant: let the ranks outlive a dead one (elastic jobs), where MPI can.
        ssh_args: options for the ssh that starts ranks on other hosts (port, identity).
        network_interfaces: the interfaces (comma-separated) MPI's TCP traffic may use.
    """

    num_proc: int
    program: Sequence[str]
    hosts: Sequence[Host] = ()
    hostfile: Optional[str] = None
    oversubscribe: bool = False
    as_root: bool = False
    output_dir: Optional[str] = None
    env_names: Sequence[str] = ()
    mpi_args: Sequence[str] = ()
    fault_tolerant: bool = False
    ssh_args: Sequence[str] = ()
    network_interfaces: Optional[str] = None


def names_a_binding(mpi_args: Sequence[str]) -> bool:
    """Whether the user's launcher arguments bind ranks themselves (`--bind-to core`,
    `-bind-to=socket`, MPICH's `-binding`), so that ours (none) stays out of their way."""
    return any(arg.startswith("-") and arg.lstrip("-").split("=", 1)[0] in ("bind-to", "binding")
               for arg in mpi_args)


class Dialect(abc.ABC):
    """How one MPI's launcher spells each part of a job."""

    def __init__(self, version: Tuple[int, ...] = ()):
        self.version = tuple(version)

    def command(self, mpirun: str, job: Job) -> List[str]:
        """The full argv: launcher options in a fixed order, then `job.program`."""
        argv = [mpirun, *self.process_count(job.num_proc)]
        if job.as_root:
            argv += self.run_as_root()
        if job.oversubscribe:
            argv += self.oversubscribe()
        if not names_a_binding(job.mpi_args):  # the launchers refuse a second binding
            argv += self.no_binding()
        argv += self.abort_on_failure() + self.output(job.output_dir)
        if job.fault_tolerant:
            argv += self.fault_tolerance()
        if job.ssh_args:
            argv += self.ssh(job.ssh_args)
        if job.network_interfaces:
            argv += self.network_interfaces(job.network_interfaces)
        if job.hostfile:
            argv += self.hostfile(job.hostfile)
        elif job.hosts:
            argv += self.host_list(job.hosts)
        if job.env_names:
            argv += self.forward_env(job.env_names)
        return argv + list(job.mpi_args) + list(job.program)

    def prepare_hostfile(self, path: str, hosts: Sequence[Host], workdir: str) -> str:
        """A hostfile this launcher reads, equivalent to the user's `path`."""
        return path

    def prepare_output_dir(self, output_dir: str, num_proc: int) -> None:
        """Make `output_dir` ready for a job of `num_proc` ranks to write its files into."""
        os.makedirs(output_dir, exist_ok=True)

    @abc.abstractmethod
    def process_count(self, num_proc: int) -> List[str]:
        """Start `num_proc` ranks."""

    def run_as_root(self) -> List[str]:
        """Allow running as root, where the launcher refuses to by default."""
        return []

    def oversubscribe(self) -> List[str]:
        """Allow more ranks than slots, where the launcher refuses to by default."""
        return []

    @abc.abstractmethod
    def no_binding(self) -> List[str]:
        """Leave ranks unpinned: frameworks start their own thread pools."""

    def abort_on_failure(self) -> List[str]:
        """End the whole job when one rank exits with an error."""
        return []

    def fault_tolerance(self) -> List[str]:
        """Keep the job running when a rank dies, so the others can re-form it (none
        where MPI cannot: the elastic launcher restarts the job instead)."""
        return []

    def ssh(self, ssh_args: Sequence[str]) -> List[str]:
        """Start the ranks of other hosts with ssh given `ssh_args` (-p PORT, -i FILE)."""
        raise LaunchError(f"{type(self).__name__}'s launcher takes no ssh options here; "
                          "put the port and identity file in ~/.ssh/config instead")

    @abc.abstractmethod
    def network_interfaces(self, interfaces: str) -> List[str]:
        """Keep MPI's TCP traffic (data and control) on `interfaces`."""

    @abc.abstractmethod
    def output(self, output_dir: Optional[str]) -> List[str]:
        """Tag each line with its rank; with `output_dir`, write one file per rank there."""

    @abc.abstractmethod
    def host_list(self, hosts: Sequence[Host]) -> List[str]:
        """Place ranks on `hosts`."""

    @abc.abstractmethod
    def hostfile(self, path: str) -> List[str]:
        """Place ranks as the hostfile at `path` says."""

    @abc.abstractmethod
    def forward_env(self, names: Sequence[str]) -> List[str]:
        """Give every rank the launcher's values of `names`."""


class OpenMpi(Dialect):
    """Open MPI's mpirun, 4.x and 5.x (PRRTE)."""

    def process_count(self, num_proc):
        return ["-np", str(num_proc)]

    def run_as_root(self):
        return ["--allow-run-as-root"]

    def oversubscribe(self):
        return ["--oversubscribe"]

    def no_binding(self):
        return ["--bind-to", "none"]

    def abort_on_failure(self):
        # MPI_Finalize starts with a job-wide barrier, so a rank that exits early (sys.exit,
        # an uncaught exception) blocks in it forever while its peers wait in a collective,
        # and mpirun never sees it exit. Without the barrier it exits, and mpirun ends the
        # job. `--mpi-args "--mca async_mpi_finalize 0"` restores the barrier.
        return ["--mca", "async_mpi_finalize", "1"]

    def fault_tolerance(self):
        # Open MPI 5 has User-Level Failure Mitigation built in (hvdplus.comm.failures).
        return ["--with-ft", "ulfm"] if self.version >= (5,) else []

    def ssh(self, ssh_args):
        # Open MPI 5's runtime (PRRTE) starts the remote daemons; 4.x's own launcher did.
        if self.version >= (5,):
            return ["--prtemca", "plm_ssh_args", shlex.join(ssh_args)]
        return ["--mca", "plm_rsh_args", shlex.join(ssh_args)]

    def network_interfaces(self, interfaces):
        control = ["--prtemca", "oob_tcp_if_include", interfaces] if self.version >= (5,) else \
            ["--mca", "oob_tcp_if_include", interfaces]
        return ["--mca", "btl_tcp_if_include", interfaces] + control

    def output(self, output_dir):
        if self.version < (5,):
            return ["--tag-output"] + (["--output-filename", output_dir] if output_dir else [])
        if output_dir is None:
            return ["--output", "tag"]
        # Open MPI 5 writes DIR/<job>/rank.N/{stdout,stderr}, but loses one of the two
        # files per rank when it creates them (openpmix PR #3651), so both go to stdout.
        return ["--output", f"tag,dir={output_dir},merge-stderr-to-stdout"]

    def host_list(self, hosts):
        return ["-H", format_host_list(hosts)]

    def hostfile(self, path):
        return ["--hostfile", path]

    def forward_env(self, names):
        return [part for name in names for part in ("-x", name)]


class Mpich(Dialect):
    """MPICH's hydra `mpiexec` (also MVAPICH's).

    Hydra needs no flag to run as root or with more ranks than cores. It ends a job early
    only when a rank dies without calling MPI_Finalize (or calls MPI_Abort): a rank that
    exits with an error after finalizing leaves the others waiting (hvdplus' own ranks
    see it through the engine and abort; see docs/troubleshooting.md).
    """

    def prepare_hostfile(self, path, hosts, workdir):
        converted = os.path.join(workdir, "hostfile")
        with open(converted, "w") as handle:
            handle.write(hydra_hostfile_text(hosts))
        return converted

    def prepare_output_dir(self, output_dir, num_proc):
        # Hydra opens the rank files without truncating them: a shorter run would leave the
        # end of an earlier one's output in place, and a larger earlier job's extra files.
        super().prepare_output_dir(output_dir, num_proc)
        for name in os.listdir(output_dir):
            if re.fullmatch(r"rank\.\d+\.std(out|err)", name):
                os.remove(os.path.join(output_dir, name))
        for rank in range(num_proc):
            for stream in ("stdout", "stderr"):
                open(os.path.join(output_dir, f"rank.{rank}.{stream}"), "w").close()

    def process_count(self, num_proc):
        return ["-n", str(num_proc)]

    def network_interfaces(self, interfaces):
        if "," in interfaces:
            raise LaunchError(f"MPICH's hydra takes one network interface, not {interfaces!r}")
        return ["-iface", interfaces]

    def no_binding(self):
        return ["-bind-to", "none"]

    def output(self, output_dir):
        if output_dir is None:
            # `-prepend-rank` tags pieces, not lines (rank_output); hvdplusrun tags lines.
            return ["-prepend-pattern", MARKER_PATTERN]
        # One file per rank needs no tags.
        return [
            "-outfile-pattern", os.path.join(output_dir, "rank.%r.stdout"),
            "-errfile-pattern", os.path.join(output_dir, "rank.%r.stderr"),
        ]

    def host_list(self, hosts):
        return ["-hosts", format_host_list(hosts)]

    def hostfile(self, path):
        return ["-f", path]

    def forward_env(self, names):
        return ["-genvlist", ",".join(names)]


class IntelMpi(Mpich):
    """Intel MPI's hydra, which pins through I_MPI_PIN rather than `-bind-to`."""

    def no_binding(self):
        return ["-genv", "I_MPI_PIN", "0"]

    def output(self, output_dir):
        # Hydra's own tags (they tag pieces, as MPICH's do): Intel's hydra is untested with
        # the markers that hvdplusrun turns into tagged lines.
        if output_dir is None:
            return ["-prepend-rank"]
        return ["-prepend-rank"] + super().output(output_dir)


DIALECTS: Dict[str, Type[Dialect]] = {"openmpi": OpenMpi, "mpich": Mpich, "intelmpi": IntelMpi}


def dialect_for(implementation: MpiImplementation) -> Dialect:
    return DIALECTS[implementation.flavour](implementation.version)


def forwarded_env_names(environ: Mapping[str, str]) -> List[str]:
    """The set variables that ranks on other nodes need, sorted."""
    return sorted(
        name for name in environ
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)
    )


def needs_oversubscribe(num_proc: int, hosts: Sequence[Host], core_count: int) -> bool:
    """Whether `num_proc` ranks exceed the slots: the hosts' slots, or this machine's cores."""
    return num_proc > (total_slots(hosts) if hosts else core_count)


def _core_of(cpu: int) -> Tuple[str, str]:
    topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(topology + "physical_package_id") as package, open(topology + "core_id") as core:
            return package.read().strip(), core.read().strip()
    except OSError:
        # No topology to read (not Linux): each hardware thread counts as a core.
        return "cpu", str(cpu)


def local_core_count() -> int:
    """Physical cores this process may use: what Open MPI counts as slots by default.

    os.cpu_count() counts hardware threads, twice the cores on most x86 servers, and
    would leave `-np` between the two counts refused for lack of slots.
    """
    if hasattr(os, "sched_getaffinity"):
        cpus = os.sched_getaffinity(0)
    else:
        cpus = range(os.cpu_count() or 1)
    return max(len({_core_of(cpu) for cpu in cpus}), 1)


# Python's one-letter options that take a value (the rest of their argument, else the next
# one), and its long option that does.
_PYTHON_OPTIONS_WITH_VALUE = "WX"
_PYTHON_LONG_OPTIONS_WITH_VALUE = ("--check-hash-based-pycs",)
EXIT_GUARD = "hvdplus.runner.exit_guard"


def _split_python_command(program: Sequence[str]) -> Optional[Tuple[List[str], List[str]]]:
    """`python [options] TARGET [args]` as (the interpreter with its options, TARGET with its
    arguments), where TARGET is a script, `-m module` or `-c code`, each apart from its value
    (`-uc code` gives `-u` and `-c code`). None for a command line that runs none of them: not
    Python, or the interactive interpreter, or a program read from standard input."""
    program = list(program)
    if not program or not os.path.basename(program[0]).startswith("python"):
        return None
    index = 1
    while index < len(program):
        arg = program[index]
        if arg == "--":
            return (program[:index], program[index + 1:]) if index + 1 < len(program) else None
        if arg == "-":
            return None
        if not arg.startswith("-"):
            return program[:index], program[index:]
        if arg in _PYTHON_LONG_OPTIONS_WITH_VALUE:
            index += 2
            continue
        if arg.startswith("--"):
            index += 1
            continue
        for position in range(1, len(arg)):
            letter, value = arg[position], arg[position + 1:]
            if letter in "cm":
                if not value and index + 1 == len(program):
                    return None
                options = program[:index] + ([arg[:position]] if position > 1 else [])
                rest = program[index + 1:] if value else program[index + 2:]
                return options, [f"-{letter}", value or program[index + 1], *rest]
            if letter in _PYTHON_OPTIONS_WITH_VALUE:
                index += 0 if value else 1
                break
        index += 1
    return None


def guarded_command(program: Sequence[str]) -> List[str]:
    """`program` started through `exit_guard` when it runs Python code (`python [options]
    script.py ...`, `-m module ...` or `-c code ...`); else unchanged."""
    split = _split_python_command(program)
    if split is None:
        return list(program)
    interpreter, target = split
    return interpreter + ["-m", EXIT_GUARD] + target
