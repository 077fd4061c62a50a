"""`hvdplusrun`: start a command on N ranks through the MPI installed with this Python.

    hvdplusrun -np 4 python train.py --lr 0.1
    hvdplusrun -np 8 -H node1:4,node2:4 --fusion-threshold-mb 32 python train.py
    hvdplusrun --check-build

Everything after the launcher's own flags (or after `--`) is the command each rank runs.
The exit status is mpirun's: non-zero when any rank failed, 128+N when the launcher was
stopped by signal N (SIGINT, SIGTERM: the job ends, and an elastic one is not restarted),
2 when no job could be started. A failed job ends with one summary of what its ranks
reported (failure_summary).
"""

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence

from ..common import rank_errors
from ..version import __version__
from . import check_build, horovod_flags, kubernetes_discovery, name_resolution, slurm_allocation
from .command import (
    Job, OpenMpi, dialect_for, forwarded_env_names, guarded_command, local_core_count, needs_oversubscribe,
)
from .elastic import ElasticOptions, HostDiscovery, run_elastic
from .errors import LaunchError
from .failure_summary import FailureReport
from .hosts import Host, on_this_machine, parse_host_list, read_hostfile, total_slots
from .lost_hosts import OPEN_MPI_LOST_HOST_MARKERS
from .mpi_discovery import MPIRUN_ENV, default_search_dirs, find_mpirun, identify_mpi
from .rank_output import MARKER_PATTERN
from .rank_threads import rank_threads_environment, threads_note, usable_cores
from .stop_signals import Stopped, stopping_on_signals
from .supervise import run_supervised
from .tuning import add_tuning_arguments, tuning_environment

__all__ = ["build_parser", "parse_args", "launch", "JobIO", "find_mpi", "main"]


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def build_parser(prog: str = "hvdplusrun") -> argparse.ArgumentParser:
    """hvdplusrun's flags; with prog "horovodrun", Horovod's too (see horovod_flags)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a command on several ranks with mpirun, hvdplus-style.",
        epilog=f"example: {prog} -np 4 python train.py --lr 0.1",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"hvdplus {__version__}")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=_positive_int, metavar="N",
                        help="number of ranks (default: the hosts' total slots)")
    placement = parser.add_mutually_exclusive_group()
    placement.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                           help="hosts and their slots, e.g. node1:4,node2:4")
    placement.add_argument("--hostfile", metavar="FILE",
                           help="file of 'host slots=N' lines")
    parser.add_argument("-p", "--ssh-port", type=_positive_int, metavar="PORT",
                        help="the port of the ssh servers on the other hosts")
    parser.add_argument("--ssh-identity-file", metavar="FILE",
                        help="the private key ssh logs in to the other hosts with")
    parser.add_argument("--network-interface", metavar="IFACE[,IFACE]",
                        help="the network interfaces MPI's TCP traffic may use, e.g. eth0")
    parser.add_argument("--mpi-args", default="", metavar="ARGS",
                        help="extra mpirun arguments, one shell-quoted string")
    parser.add_argument("--output-filename", metavar="DIR",
                        help="write each rank's output to its own file under DIR")
    parser.add_argument("--no-exit-guard", dest="exit_guard", action="store_false",
                        help="run a Python program as given, not through hvdplus.runner.exit_guard: a rank that "
                             "exits with an error then ends the job only when MPI notices")
    parser.add_argument("--verbose", action="store_true",
                        help="print the mpirun command line before running it; when ranks fail, print their tracebacks "
                             "and MPI's messages whole, not only the summary")
    parser.add_argument("--check-build", action="store_true",
                        help="show the MPI and frameworks this installation can use, and exit")
    name_resolution.add_arguments(parser)
    add_tuning_arguments(parser)
    elastic = parser.add_argument_group("elastic jobs (any of the first three makes a job elastic)")
    elastic.add_argument("--min-np", type=_positive_int, metavar="N",
                         help="fewest ranks the job may run on (default: 1)")
    elastic.add_argument("--max-np", type=_positive_int, metavar="N",
                         help="most ranks the job may grow to (default: every slot found)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="prints the available hosts, one 'host:slots' per line; run every second")
    elastic.add_argument("--max-restarts", type=int, default=3, metavar="N",
                         help="times the job may be started again after ranks died (default: 3)")
    elastic.add_argument("--elastic-timeout", type=float, default=600.0, metavar="SECONDS",
                         help="how long to wait for --min-np slots (default: 600)")
    elastic.add_argument("--no-in-place", dest="in_place", action="store_false",
                         help="restart the job after a failure instead of re-forming it on the survivors")
    kubernetes_discovery.add_arguments(elastic)
    parser.add_argument("--horovod-compat", action="store_true",
                        help="let the ranks import Horovod's modules (import horovod.torch ...) from hvdplus, "
                             "unless a real Horovod is installed")
    if prog == "horovodrun":
        horovod_flags.add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: str = "hvdplusrun") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if prog == "horovodrun":
        horovod_flags.check(parser, args)
        args.horovod_compat = True
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command and not args.check_build:
        parser.error(f"no command given; e.g. {prog} -np 2 python train.py")
    return args


def given_hosts(args: argparse.Namespace) -> List[Host]:
    """The hosts that -H or --hostfile name; none for this machine alone."""
    if args.hosts:
        return parse_host_list(args.hosts)
    if args.hostfile:
        return read_hostfile(args.hostfile)
    return []


def job_hosts(args: argparse.Namespace) -> List[Host]:
    """The hosts a launch of `args` runs on: those -H or --hostfile name, else those of the
    Slurm allocation it runs in; none for this machine alone."""
    return _hosts_in(given_hosts(args), slurm_allocation.find_allocation(os.environ))


def _hosts_in(given: List[Host], allocation: Optional[slurm_allocation.SlurmAllocation]) -> List[Host]:
    """`given` (-H, --hostfile), else the hosts of `allocation` unless it is this machine alone."""
    if given or allocation is None or on_this_machine(allocation.hosts):
        return given
    return list(allocation.hosts)


def _ssh_args(args: argparse.Namespace) -> List[str]:
    ssh_args = []
    if args.ssh_port:
        ssh_args += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        if not os.path.isfile(args.ssh_identity_file):
            raise LaunchError(f"--ssh-identity-file {args.ssh_identity_file}: no such file")
        ssh_args += ["-i", os.path.abspath(args.ssh_identity_file)]
    return ssh_args


def find_mpi():
    """The mpirun to use, and how to spell a job for it (its Dialect)."""
    mpirun = find_mpirun(default_search_dirs(), os.environ.get(MPIRUN_ENV))
    return mpirun, dialect_for(identify_mpi(mpirun))


def _is_elastic(args: argparse.Namespace) -> bool:
    return bool(args.min_np or args.max_np or args.host_discovery_script or args.host_discovery)


@dataclasses.dataclass
class JobIO:
    """What a caller of `launch` from Python (hvdplus.run) exchanges with the job's ranks:
    their messages to it (launcher_messages) that are not the launcher's own, and variables
    for them, passed to every host. With `failures`, the ranks report their failures to it
    instead of printing their tracebacks (hvdplus.common.rank_errors), and MPI's messages about
    an abort are folded into one line each (abort_banners), unless --verbose."""

    on_message: Optional[Callable[[dict], None]] = None
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    failures: Optional[FailureReport] = None


def launch(args: argparse.Namespace, io: Optional[JobIO] = None) -> int:
    """Start the job `args` describes and wait for it; return the exit status."""
    io = io or JobIO()
    hosts = given_hosts(args)
    allocation = slurm_allocation.find_allocation(os.environ)
    if allocation is not None:
        slurm_allocation.fit_to_allocation(allocation, hosts, args.num_proc)
        if args.verbose:
            print(f"hvdplusrun: {allocation.describe()}", flush=True)
        # mpirun starts its daemons on these hosts through srun: no ssh between them.
        hosts = _hosts_in(hosts, allocation)
    if _is_elastic(args):
        return _launch_elastic(args, hosts, io, allocation)
    num_proc = args.num_proc or total_slots(hosts) or (allocation and total_slots(allocation.hosts))
    if not num_proc:
        raise LaunchError("-np is required unless -H or --hostfile give the slots")
    return _run_job(args, hosts, num_proc, io=io)


def _launch_elastic(args: argparse.Namespace, hosts: List[Host], io: JobIO,
                    allocation: Optional[slurm_allocation.SlurmAllocation] = None) -> int:
    if not args.host_discovery_script and not hosts and allocation is not None:
        hosts = list(allocation.hosts)
    if not args.host_discovery_script and not args.host_discovery and not hosts:
        slots = args.max_np or args.num_proc
        if not slots:
            raise LaunchError("an elastic job needs -np, --max-np, -H, --hostfile or --host-discovery-script")
        hosts = [Host("localhost", slots)]
    options = ElasticOptions(
        num_proc=args.num_proc, min_np=args.min_np, max_np=args.max_np,
        discovery_script=args.host_discovery_script, max_restarts=args.max_restarts,
        elastic_timeout=args.elastic_timeout, in_place=args.in_place,
        outlives_failures=bool(find_mpi()[1].fault_tolerance()),
    )

    def start(job_hosts, num_proc, env, tick, report):
        lost = []

        def take(message):
            if not report.take(message) and io.on_message is not None:
                io.on_message(message)

        status = _run_job(args, job_hosts, num_proc, extra_env=env, fault_tolerant=True, on_tick=tick,
                          hostfile_given=False, lost_hosts=lost, io=dataclasses.replace(io, on_message=take))
        if lost:  # MPI ended the job with its ranks: restart it without the hosts it lost
            report.mpi_lost_hosts(lost)
        return status

    if allocation is not None and not args.host_discovery_script and not args.host_discovery:
        discovery = slurm_allocation.SlurmNodeDiscovery(allocation)
        # A lost node's job step still holds its CPUs in Slurm's books: the next mpirun's
        # daemons share them (srun --overlap) rather than wait for a step that never ends.
        io = dataclasses.replace(io, env={**io.env, "SLURM_OVERLAP": "1"})
    else:
        discovery = kubernetes_discovery.from_args(args) if args.host_discovery else \
            HostDiscovery(args.host_discovery_script, hosts)
    return run_elastic(options, discovery, start)


def _run_job(args: argparse.Namespace, hosts: List[Host], num_proc: int, extra_env=None,
             fault_tolerant: bool = False, on_tick=None, hostfile_given: bool = True, lost_hosts=None,
             io: Optional[JobIO] = None) -> int:
    """Run one mpirun of `num_proc` ranks on `hosts` to its end; return its exit status."""
    io = io or JobIO()
    mpirun, dialect = find_mpi()
    env = dict(os.environ, **tuning_environment(args), **horovod_flags.environment(args), **io.env,
               **(extra_env or {}))
    name_resolution.wait_for_job_hosts(args, hosts, env)
    if args.horovod_compat:
        env["PYTHONPATH"] = horovod_flags.python_path_with_alias(env.get("PYTHONPATH"))
    cores = local_core_count()
    usable = usable_cores(cores)
    threads = rank_threads_environment(env, num_proc, local_only=on_this_machine(hosts), core_count=usable)
    env.update(threads)
    note = threads_note(threads, num_proc, usable)
    if note:
        print(note, file=sys.stderr, flush=True)
    # hvdplus' shared window is Open MPI's osc/sm; osc/ucx would only print a failed query.
    env.setdefault("OMPI_MCA_osc", "^ucx")
    output_dir = os.path.abspath(args.output_filename) if args.output_filename else None
    if output_dir:
        dialect.prepare_output_dir(output_dir, num_proc)
    # A rank whose output goes to a file prints its traceback there, as without a launcher.
    env.pop(rank_errors.REPORT_ENV, None)
    if io.failures is not None and not output_dir:
        env[rank_errors.REPORT_ENV] = rank_errors.SEND_AND_PRINT if args.verbose else rank_errors.SEND
    with tempfile.TemporaryDirectory(prefix="hvdplusrun-") as workdir:
        hostfile = hostfile_given and args.hostfile and dialect.prepare_hostfile(args.hostfile, hosts, workdir)
        job = Job(
            num_proc=num_proc,
            program=guarded_command(args.command) if args.exit_guard else list(args.command),
            hosts=hosts,
            hostfile=hostfile,
            oversubscribe=needs_oversubscribe(num_proc, hosts, cores),
            as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
            output_dir=output_dir,
            env_names=sorted(set(forwarded_env_names(env)) | set(io.env)),
            mpi_args=shlex.split(args.mpi_args),
            fault_tolerant=fault_tolerant,
            ssh_args=_ssh_args(args),
            network_interfaces=args.network_interface,
        )
        argv = dialect.command(mpirun, job)
        if args.verbose:
            print(shlex.join(argv), flush=True)
        # A launcher that marks its output's pieces leaves the lines to hvdplusrun (rank_output).
        # Only a job with other hosts can lose one (see lost_hosts).
        watch = OPEN_MPI_LOST_HOST_MARKERS if isinstance(dialect, OpenMpi) and not on_this_machine(hosts) else None
        # An elastic launch must be over, every rank of it, before the next one starts.
        return run_supervised(argv, env, tag_lines=MARKER_PATTERN in argv, on_tick=on_tick,
                              lost_host_markers=watch, lost_hosts=lost_hosts, end_leftovers=fault_tolerant,
                              on_message=_delivery(io), fold_abort_banners=io.failures is not None and not args.verbose)


def _delivery(io: JobIO) -> Optional[Callable[[dict], None]]:
    """Where the ranks' messages go: to `io.failures` those that report a failure, the rest to `io.on_message`."""
    if io.failures is None:
        return io.on_message
    failures, on_message = io.failures, io.on_message

    def deliver(message: dict) -> None:
        if not failures.take(message) and on_message is not None:
            on_message(message)

    return deliver


def main(argv: Optional[Sequence[str]] = None, prog: str = "hvdplusrun") -> int:
    """Entry point of `hvdplusrun` and `python -m hvdplus.runner` (and of horovodrun, with
    its `prog`)."""
    args = parse_args(argv, prog)
    try:
        if args.check_build:
            print(check_build.build_report())
            return 0
        failures = FailureReport()
        with stopping_on_signals():
            status = launch(args, JobIO(failures=failures))
        if status != 0 and failures.failures():
            print(failures.summary(status, prefix=f"{prog}: "), file=sys.stderr, flush=True)
        return status
    except Stopped as stop:
        print(f"{prog}: {stop}", file=sys.stderr, flush=True)
        return stop.exit_status
    except LaunchError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
