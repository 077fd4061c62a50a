"""`hvdplusrun`'s elastic mode (`--min-np`, `--max-np`, `--host-discovery-script`).

The launcher keeps a folder for the job (HVDPLUS_ELASTIC_DIR, see
hvdplus.common.elastic_files) across launches of mpirun, reads what the ranks tell it in
their output (hvdplus.common.launcher_messages; rank 0 may run on any host), and:

- starts each launch with Open MPI's failure mitigation on, so that the ranks outlive a
  dead one and re-form the job in place (hvdplus.elastic.run);
- starts the job again when a launch ends asking for it (ranks died and in-place recovery
  is off or left too few ranks; or slots were added), or when mpirun lost a host, or, where
  MPI cannot outlive a rank, after any failure; after failures, at most `--max-restarts`
  times; never after SIGINT or SIGTERM to the launcher, which ends the job wherever it
  stands (stop_signals.Stopped passes through here, leaving only the job's folder to remove);
- runs the discovery script every `DISCOVERY_SECONDS` while a launch runs, and tells the
  ranks when it finds more slots than the job has, so they restart at their next commit;
- counts the slots of ranks that died as gone: a failed remote host is left out for the
  rest of the job; on this machine, only the failed ranks' slots are.
"""

import dataclasses
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

from ..common import elastic_files
from .errors import LaunchError
from .hosts import Host, parse_hostfile, total_slots

__all__ = ["ElasticOptions", "HostDiscovery", "SlotLedger", "RestartRequest", "LaunchReport", "run_elastic",
           "DISCOVERY_SECONDS"]

DISCOVERY_SECONDS = 1.0
_DISCOVERY_TIMEOUT_S = 30.0


@dataclasses.dataclass
class RestartRequest:
    """Why the ranks of one launch ended: "failure" (ranks died) or "hosts" (slots were added)."""

    reason: str
    failed_ranks: List[int] = dataclasses.field(default_factory=list)
    failed_hosts: List[str] = dataclasses.field(default_factory=list)


class LaunchReport:
    """What the ranks of one launch, and mpirun, said about it while it ran."""

    def __init__(self):
        self.restart: Optional[RestartRequest] = None
        self.lost_in_place: List[str] = []  # the hosts of ranks the job re-formed without

    def take(self, message: dict) -> bool:
        """One of the ranks' messages (hvdplus.elastic.run sends them); whether it was one
        about the job's members."""
        if "restart" in message:
            self.restart = RestartRequest(str(message["restart"]), list(message.get("failed_ranks", [])),
                                          list(message.get("failed_hosts", [])))
        elif "lost_hosts" in message:
            self.lost_in_place.extend(message["lost_hosts"])
        else:
            return False
        return True

    def mpi_lost_hosts(self, hosts: Sequence[str]) -> None:
        """mpirun lost `hosts`, and ended the job with them (a host or its container gone: Open
        MPI ends every rank then, in place or not). Its word on which hosts are gone is the one
        that counts: ending the job, it also ends the ranks on the hosts that are fine, and a
        survivor that saw them die first may have asked for a restart, or re-formed the job,
        without them too."""
        self.restart = RestartRequest("failure", failed_hosts=list(hosts))
        self.lost_in_place = []


# Starts one launch: (hosts, ranks, extra environment, tick, report) -> mpirun's exit status.
Starter = Callable[[List[Host], int, Dict[str, str], Callable[[], None], LaunchReport], int]


@dataclasses.dataclass(frozen=True)
class ElasticOptions:
    """The elastic flags, as Horovod and torchrun name them."""

    num_proc: Optional[int]
    min_np: Optional[int]
    max_np: Optional[int]
    discovery_script: Optional[str]
    max_restarts: int = 3
    elastic_timeout: float = 600.0
    in_place: bool = True
    # Whether MPI lets the ranks outlive a dead one: then they report every death
    # themselves, and a launch that fails without asking for a restart failed for
    # another reason (an error in the program), which a restart would only repeat.
    outlives_failures: bool = True


class HostDiscovery:
    """The hosts and slots available now: the discovery script's output ("host:slots" or
    hostfile lines), else the fixed hosts given with -H or --hostfile."""

    def __init__(self, script: Optional[str], fixed: Sequence[Host]):
        self.script = script
        self.fixed = list(fixed)

    def hosts(self) -> List[Host]:
        if self.script is None:
            return list(self.fixed)
        try:
            output = subprocess.run([self.script], capture_output=True, text=True, check=True,
                                    timeout=_DISCOVERY_TIMEOUT_S).stdout
        except (OSError, subprocess.SubprocessError) as error:
            raise LaunchError(f"host discovery script {self.script!r} failed: {error}") from None
        lines = [line.strip().replace(":", " slots=", 1) if ":" in line else line.strip()
                 for line in output.splitlines() if line.strip()]
        return parse_hostfile("\n".join(lines), source=self.script)


class SlotLedger:
    """Which slots the job lost to ranks that died."""

    def __init__(self):
        self.blacklisted: Dict[str, int] = {}
        self.local_lost = 0

    def record(self, failed_hosts: Sequence[str]) -> None:
        for host in failed_hosts:
            if _is_this_machine(host):
                self.local_lost += 1
            else:
                self.blacklisted[host] = self.blacklisted.get(host, 0) + 1

    def usable(self, hosts: Sequence[Host]) -> List[Host]:
        lost_here = self.local_lost
        usable = []
        for host in hosts:
            if host.name in self.blacklisted:
                continue
            slots = host.slots
            if _is_this_machine(host.name) and lost_here:
                taken = min(lost_here, slots)
                slots, lost_here = slots - taken, lost_here - taken
            if slots:
                usable.append(Host(host.name, slots))
        return usable


def _is_this_machine(name: str) -> bool:
    return name in ("localhost", "127.0.0.1", socket.gethostname())


def _first_slots(hosts: Sequence[Host], count: int) -> List[Host]:
    """The hosts that hold the first `count` slots, in order."""
    chosen = []
    for host in hosts:
        if count <= 0:
            break
        chosen.append(Host(host.name, min(host.slots, count)))
        count -= host.slots
    return chosen


def _say(message: str) -> None:
    print(f"hvdplusrun: {message}", file=sys.stderr, flush=True)


class _Launches:
    """The state of one elastic job across its launches."""

    def __init__(self, options: ElasticOptions, discovery: HostDiscovery, folder: str):
        self.options = options
        self.discovery = discovery
        self.folder = folder
        self.generation = 0
        self.running = 0
        self.announced = 0
        self.lost: List[str] = []  # the hosts of every rank the job lost, one entry per rank
        self.report = LaunchReport()
        self._last_look = 0.0

    def available(self) -> List[Host]:
        """The discovered hosts less the slots of the ranks the job lost."""
        ledger = SlotLedger()
        ledger.record(self.lost + self.report.lost_in_place)
        return ledger.usable(self.discovery.hosts())

    def wait_for_slots(self) -> List[Host]:
        """The usable hosts once they have at least --min-np slots; LaunchError after
        --elastic-timeout."""
        needed = self.options.min_np or 1
        deadline = time.monotonic() + self.options.elastic_timeout
        problem = None
        while True:
            try:
                hosts = self.available()
                if total_slots(hosts) >= needed:
                    return hosts
                found = f"only {total_slots(hosts)} usable slots, fewer than --min-np {needed}"
            except LaunchError as error:  # a discovery script that fails now may work later
                found = str(error)
            if found != problem:  # a wait is never silent: each new reason is said once
                _say(f"{found}; waiting up to {deadline - time.monotonic():.0f} s more for hosts")
            problem = found
            if time.monotonic() >= deadline:
                raise LaunchError(f"{problem}, after waiting {self.options.elastic_timeout:.0f} s")
            time.sleep(DISCOVERY_SECONDS)

    def tick(self) -> None:
        """While a launch runs: announce more slots than it has, once per generation."""
        now = time.monotonic()
        if now - self._last_look < DISCOVERY_SECONDS:
            return
        self._last_look = now
        try:
            found = total_slots(self.available())
        except LaunchError as error:
            _say(str(error))
            return
        limit = self.options.max_np or found
        # Ranks this launch lost in place no longer count as running.
        running = self.running - len(self.report.lost_in_place)
        if running < min(found, limit) and found > self.announced:
            self.generation += 1
            self.announced = found
            elastic_files.write_hosts(self.folder, self.generation, found)
            _say(f"{found} slots available (the job has {running}); the ranks restart at their next commit")

    def next_report(self) -> LaunchReport:
        """Close the last launch's report (its losses count from now on) and open one for the next."""
        self.lost.extend(self.report.lost_in_place)
        self.report = LaunchReport()
        return self.report


def run_elastic(options: ElasticOptions, discovery: HostDiscovery, start: Starter) -> int:
    """Run the job until it ends without asking to be restarted; return its exit status."""
    folder = tempfile.mkdtemp(prefix="hvdplusrun-elastic-")
    launches = _Launches(options, discovery, folder)
    restarts = 0
    first = True
    try:
        while True:
            hosts = launches.wait_for_slots()
            count = total_slots(hosts)
            if options.max_np:
                count = min(count, options.max_np)
            if first and options.num_proc:
                count = min(count, options.num_proc)
            first = False
            launches.running = launches.announced = count
            env = {
                "HVDPLUS_ELASTIC_DIR": folder,
                elastic_files.GENERATION_ENV: str(launches.generation),
                "HVDPLUS_ELASTIC_MIN_NP": str(options.min_np or 1),
                "HVDPLUS_ELASTIC_IN_PLACE": "1" if options.in_place else "0",
            }
            report = launches.next_report()
            status = start(_first_slots(hosts, count), count, env, launches.tick, report)
            request = report.restart
            if request is None:
                if status == 0 or options.outlives_failures or restarts >= options.max_restarts:
                    return status
                restarts += 1
                _say(f"the job failed (exit {status}); restart {restarts} of at most {options.max_restarts}")
                continue
            if request.reason == "failure":
                launches.lost.extend(request.failed_hosts)
                restarts += 1
                blacklisted = sorted(host for host in request.failed_hosts if not _is_this_machine(host))
                _say((f"ranks {request.failed_ranks} died" if request.failed_ranks else "the job lost a host")
                     + (f"; hosts {blacklisted} are left out from now on" if blacklisted else "")
                     + f"; restart {restarts} of at most {options.max_restarts}")
                if restarts > options.max_restarts:
                    return 1
            else:
                _say("restarting the job on the new slots")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
