"""Run mpirun as a child that the launcher answers for.

mpirun starts in a session of its own, so a Ctrl-C in the terminal reaches only the
launcher, which passes SIGINT and SIGTERM on to mpirun for an orderly teardown. If mpirun
has not ended `kill_after` seconds later, every process of its session (mpirun and the
ranks, each in a process group of its own) is killed; the session is swept again once
mpirun has ended, so no rank outlives a job it was asked to end. The launcher then stops
(`stop_signals.Stopped`), whatever mpirun's status says: a signal is never a failure to
restart from.

With `tag_lines`, mpirun's output goes through `rank_output`, which turns the pieces MPICH's
hydra marks with their rank into whole tagged lines.
"""

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .abort_banners import AbortBannerFolder
from .lost_hosts import lost_host_names, start_watching_relay
from .rank_output import binary_target, start_relay
from .stop_signals import PASSED_ON_SIGNALS, Stopped, replace_handlers, restore_handlers

__all__ = ["run_supervised", "exit_status", "kill_session", "KILL_AFTER_SECONDS"]

POLL_SECONDS = 0.2
# How long after mpirun starts the launcher holds SIGUSR1/SIGUSR2 before passing them on.
PASS_ON_AFTER_SECONDS = 5.0
# How long mpirun may take to end its ranks after a signal: a job asked to stop is gone
# within 5 s, however its ranks answer the signal.
KILL_AFTER_SECONDS = 3.0
# How long the relays may wait, once mpirun has ended, for the end of its output.
RELAY_DRAIN_SECONDS = 5.0


def exit_status(returncode: int) -> int:
    """The launcher's exit status for mpirun's `returncode`: 128+N when mpirun died of signal
    N, as shells report it, else mpirun's own status."""
    return 128 - returncode if returncode < 0 else returncode


def _session_members(session_id: int) -> Iterator[int]:
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        # Without /proc the session's leader (mpirun) is the one process we can name.
        yield session_id
        return
    for entry in entries:
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session_id:
                    yield int(entry)
            except (ProcessLookupError, PermissionError):
                continue


def kill_session(session_id: int) -> None:
    """SIGKILL every process of the session `session_id`."""
    for pid in _session_members(session_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def run_supervised(
    argv: Sequence[str], env: Optional[Mapping[str, str]] = None, kill_after: float = KILL_AFTER_SECONDS,
    tag_lines: bool = False, on_tick: Optional[Callable[[], None]] = None,
    lost_host_markers: Optional[Sequence[bytes]] = None, lost_hosts: Optional[List[str]] = None,
    end_leftovers: bool = False, on_message: Optional[Callable[[dict], None]] = None,
    fold_abort_banners: bool = False,
) -> int:
    """Run `argv` to completion, forwarding SIGINT/SIGTERM; return the launcher's exit status,
    or raise `Stopped` once mpirun's session is gone when the launcher received a signal.

    Args:
        argv: the mpirun command line.
        env: its environment (None: the launcher's).
        kill_after: seconds between the first forwarded signal and killing the session.
        tag_lines: mpirun marks each piece of output with its rank (`rank_output`);
            write whole lines tagged with it instead.
        on_tick: called about every POLL_SECONDS while mpirun runs (elastic host discovery).
        lost_host_markers: what mpirun writes to its standard output or error when it loses
            a host (lost_hosts); a job that did is reported failed even if mpirun exits with 0.
        lost_hosts: a list to which the names of the hosts lost are added, once each.
        end_leftovers: once mpirun has ended, kill what it started on this machine and left
            running (ranks outlive a prterun that gives up on a lost host), so that a launch
            is over when this returns.
        on_message: called with each message of the ranks to the launcher (launcher_messages),
            which their output then goes without; None passes such lines on as they are.
        fold_abort_banners: write MPI's messages about an abort as one line each (abort_banners).
    """
    watched = lost_host_markers is not None and not tag_lines
    pipe = subprocess.PIPE if tag_lines or watched or on_message is not None or fold_abort_banners else None
    received: List[Tuple[int, float]] = []  # (signal, when), first one first
    child = None

    def forward(signum, _frame):
        received.append((signum, time.monotonic()))
        if child is not None:
            child.send_signal(signum)

    passed_on: List[int] = []  # waiting for the ranks to have started

    def pass_on(signum, _frame):
        passed_on.append(signum)

    # In place before mpirun starts, so that no signal finds the launcher between the two.
    previous = {**replace_handlers(pass_on, PASSED_ON_SIGNALS), **replace_handlers(forward)}
    relays, folders = [], []
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True, stdout=pipe, stderr=pipe)
        started = time.monotonic()
        if received:
            child.send_signal(received[0][0])
        # Looked up now, not at import: a notebook's kernel puts in streams of its own per cell.
        stdout, stderr = binary_target(sys.stdout), binary_target(sys.stderr)
        if fold_abort_banners:
            folders = [AbortBannerFolder(stdout), AbortBannerFolder(stderr)]
            stdout, stderr = folders
        if tag_lines:
            relays = [start_relay(child.stdout, stdout, on_message),
                      start_relay(child.stderr, stderr, on_message)]
        elif pipe is not None:
            # prterun writes some of its messages about a lost host to standard output.
            markers = lost_host_markers if watched else ()
            relays = [start_watching_relay(child.stdout, stdout, markers, on_message),
                      start_watching_relay(child.stderr, stderr, markers, on_message)]
        while True:
            try:
                returncode = child.wait(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                # A rank that has not yet started Python would die of SIGUSR1; once started,
                # it keeps the signal for hvd.elastic.run (exit_guard, hvd.init).
                if passed_on and time.monotonic() - started >= PASS_ON_AFTER_SECONDS:
                    for signum in passed_on:
                        child.send_signal(signum)
                    passed_on.clear()
                if on_tick is not None and not received:
                    on_tick()
                if received and time.monotonic() - received[0][1] >= kill_after:
                    kill_session(child.pid)
        if received or end_leftovers:
            kill_session(child.pid)
    finally:
        for relay in relays:
            # Ranks that outlive mpirun may hold its pipes open: wait for the end of its
            # output a while, then for the rest of it to be written, however long that takes.
            if relay.at_end.wait(RELAY_DRAIN_SECONDS):
                relay.join()
        for folder in folders:
            folder.close()  # what a block the output ended in held back
        restore_handlers(previous)
    if received:
        raise Stopped(received[0][0])
    lost = [relay for relay in relays if getattr(relay, "seen", None) and relay.seen.is_set()]
    if lost_hosts is not None:
        # Both streams may name the same host.
        names = [name for relay in lost for name in lost_host_names(bytes(relay.after_marker))]
        lost_hosts.extend(dict.fromkeys(names))
    if returncode == 0 and lost:
        print("hvdplusrun: mpirun lost a host and ended the job, yet exited with 0; exiting with 1",
              file=sys.stderr, flush=True)
        returncode = 1
    return exit_status(returncode)
