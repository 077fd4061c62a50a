"""`hvdplus.elastic.run`: call the training function again after the job re-forms.

When a rank dies, every survivor's pending and next collective raises RanksFailedError.
The survivors roll their state back to its last commit and re-form the job among
themselves (`runtime.reform`), or, where in-place recovery is off, tell the launcher which
ranks died and end, so that `hvdplusrun` starts the job again on the slots that remain.
When the launcher adds slots, `state.commit()` raises HostsUpdatedInterrupt on every rank
and the ranks end the same way, to be started again on more slots; the restarted job
resumes from the newest commit its hosts hold on disk (hvdplus.elastic.commits).

What the launcher must know (ranks that died, a restart wanted) rank 0 tells it in a line
of its output (hvdplus.common.launcher_messages), which reaches it from any host.

A stop signal (HVDPLUS_STOP_SIGNALS: SIGUSR1, SIGTERM) stops every rank at the same commit,
once that commit is written (hvdplus.common.stop_requests); inside a Slurm job the ranks
then ask Slurm to requeue it (hvdplus.elastic.slurm_requeue), and the requeued job resumes
from the commit, in the shared HVDPLUS_COMMIT_DIR or on the hosts' disks.
"""

import functools
import os
import socket
import sys
import time

from ..common import launcher_messages
from ..common.errors import HostsUpdatedInterrupt, RanksFailedError
from ..core import runtime
from ..common import stop_requests
from . import slurm_requeue
from .state import StopRequested

__all__ = ["run"]


def run(func):
    """Decorate `func(state, ...)` so it survives re-forms of the job: it is called again,
    with `state` rolled back to its last commit and synced from the new rank 0, until it
    returns."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        stop_requests.install(runtime.settings("elastic.run").stop_signals)
        while True:
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except StopRequested as stop:
                _end_for_stop(stop)
            except HostsUpdatedInterrupt:
                _end_for_restart(state, {"restart": "hosts"})
            except Exception as error:
                # A framework that runs the step as compiled code (a tf.function, a JAX
                # callback) hands a RanksFailedError on wrapped in an error of its own: what
                # tells a failure is the engine having seen a rank die.
                if not (isinstance(error, RanksFailedError) or _peers_lost()):
                    raise
                state.restore()
                _recover(state)
            state.on_reset()

    return wrapper


def _peers_lost() -> bool:
    """Whether the engine has seen a rank die since the job last (re-)formed."""
    return runtime.peers_lost()


def _recover(state) -> None:
    """Re-form the job on the survivors; or, where it is to restart instead, end it."""
    started = time.monotonic()
    old_size = runtime.size()
    lost = runtime.reform()
    settings = runtime.settings("elastic.run")
    if settings.in_place_recovery and runtime.size() >= settings.elastic_min_np:
        if runtime.rank() == 0:
            sys.stderr.write(
                f"hvdplus: ranks {[rank for rank, _ in lost]} of {old_size} died; the other "
                f"{runtime.size()} re-formed the job in {time.monotonic() - started:.2f} s\n")
            sys.stderr.flush()
            if settings.elastic_dir is not None:
                launcher_messages.send({"lost_hosts": [host for _, host in lost]})
        return
    _end_for_restart(state, {"restart": "failure", "failed_ranks": [rank for rank, _ in lost],
                             "failed_hosts": [host for _, host in lost]})


def _end_for_stop(stop: StopRequested) -> None:
    """End every rank after a stop signal (the commit is written): one rank of each host asks
    Slurm, in turn, to requeue the job (unless HVDPLUS_REQUEUE=0)."""
    settings = runtime.settings("elastic.run")
    outcome = "not requeued (HVDPLUS_REQUEUE=0)"
    if settings.requeue and runtime.local_rank() == 0:
        outcome = slurm_requeue.request_requeue(os.environ, runtime.cross_rank(), settings.max_requeues)
    if runtime.rank() == 0 or (runtime.local_rank() == 0 and ("failed" in outcome or "could not" in outcome)):
        elapsed = stop_requests.seconds_since_request()
        since = f", {elapsed:.1f} s after the signal reached rank {runtime.rank()}" if elapsed is not None else ""
        sys.stderr.write(f"hvdplus: {stop}{since}; rank {runtime.rank()} on {socket.gethostname()}: {outcome}\n")
        sys.stderr.flush()
    runtime.shutdown()
    raise SystemExit(0)


def _end_for_restart(state, request: dict) -> None:
    """End every rank, leaving the last commit of `state` on each host's disk and telling
    the launcher `request`, so that it starts the job again from there."""
    if runtime.settings("elastic.run").elastic_dir is None:
        raise RuntimeError(
            f"hvdplus: the job must restart ({request['restart']}), but it was not started by "
            "hvdplusrun's elastic mode (--min-np/--max-np/--host-discovery-script), which restarts it"
        )
    state.write_checkpoint()
    if runtime.rank() == 0:
        launcher_messages.send(request)
    runtime.shutdown()
    raise SystemExit(0)
