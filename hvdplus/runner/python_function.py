"""`hvdplus.run(fn, np=4)`: run a Python function on every rank of a job, from Python, and
get back what each rank returned.

    import hvdplus

    def train(lr):
        import hvdplus.torch as hvd
        hvd.init()
        ...
        return hvd.rank(), final_loss

    results = hvdplus.run(train, args=(0.1,), np=4)   # [(0, loss), (1, loss), ...] in rank order

The job starts through the same launcher as `hvdplusrun` (in this process), so hosts, elastic
flags, tuning flags and MPICH behave the same; output comes tagged by rank. The function and its
arguments travel cloudpickled in variables of the ranks' environment (function_payload), the
ranks' results and errors in lines of their output (hvdplus.run_rank); large ones go through
the job's channel instead, a port of this process's that only the job's ranks can use
(payload_channel). No file is shared with the ranks.
"""

import base64
import os
import shlex
import signal
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import cloudpickle

from ..common import function_payload
from ..common.payload_channel import JobChannel
from ..common.rank_errors import RankFailure
from .dynamic_code import restore_sources, source_files
from .errors import LaunchError
from .failure_summary import FailureReport, format_summary
from .hosts import on_this_machine
from .launch import JobIO, build_parser, job_hosts, launch, parse_args
from .slurm_allocation import find_allocation
from .stop_signals import Stopped, stopping_on_signals

__all__ = ["run", "run_with_launcher", "RanksRaisedError", "RankFailure"]


class RanksRaisedError(RuntimeError):
    """Ranks of a job that `hvdplus.run` started raised; `failures` holds each one's
    RankFailure (hvdplus.common.rank_errors: host, exception, the user's line, traceback), by
    rank, the first reported first. Its message is the job's failure summary (failure_summary)."""

    def __init__(self, failures: Dict[int, RankFailure], status: int):
        self.failures = failures
        self.status = status
        super().__init__(format_summary(failures, status, first=next(iter(failures))))

    def __reduce__(self):
        # Rebuilt from its own arguments, so that it travels (through Ray's object store).
        return type(self), (self.failures, self.status)


class _Results:
    """The ranks' messages to the caller, as they arrive (from the launcher's output threads):
    a result in pieces of the message lines, or, when large, posted to the job's `channel`
    under the token its message names."""

    def __init__(self, channel: JobChannel):
        self._lock = threading.Lock()
        self._channel = channel
        self.pieces: Dict[int, Dict[int, str]] = {}
        self.expected: Dict[int, int] = {}
        self.posted: Dict[int, bytes] = {}
        self.failures = FailureReport()  # the launcher hands it the ranks' errors (JobIO.failures)

    def take(self, message: dict) -> None:
        with self._lock:
            if "run_started" in message:  # a launch starts: what an earlier one returned is void
                self.pieces.clear()
                self.expected.clear()
                self.posted.clear()
            elif "result" in message and "posted" in message:
                self.posted[int(message["result"])] = self._channel.taken(message["posted"])
            elif "result" in message:
                rank = int(message["result"])
                self.pieces.setdefault(rank, {})[int(message["piece"])] = message["data"]
                self.expected[rank] = int(message["pieces"])

    def values(self) -> Dict[int, Any]:
        """Each rank's returned value, for the ranks whose every piece arrived."""
        values = {rank: cloudpickle.loads(data) for rank, data in self.posted.items()}
        for rank, pieces in self.pieces.items():
            if len(pieces) == self.expected[rank]:
                encoded = "".join(pieces[index] for index in range(len(pieces)))
                values[rank] = cloudpickle.loads(base64.b64decode(encoded))
        return values


def launcher_flags(options: Dict[str, Any]) -> List[str]:
    """hvdplusrun's flags for keyword arguments named as its options are (`fusion_threshold_mb=32`,
    `max_restarts=5`, `in_place=False`)."""
    actions = {action.dest: action for action in build_parser("hvdplus.run")._actions
               if action.option_strings and action.dest not in ("help", "version", "check_build")}
    flags = []
    for name, value in options.items():
        action = actions.get(name)
        if action is None:
            raise TypeError(f"hvdplus.run() got an unexpected keyword argument {name!r}; the launcher's options "
                            f"are {', '.join(sorted(actions))}")
        flag = action.option_strings[-1]
        if action.nargs == 0:  # a switch: store_true or store_false
            if bool(value) != bool(action.default):
                flags.append(flag)
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def run(fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, np: Optional[int] = None,
        hosts: Union[None, str, Sequence[str]] = None, hostfile: Optional[str] = None,
        min_np: Optional[int] = None, max_np: Optional[int] = None, env: Optional[Dict[str, str]] = None,
        start_timeout: Optional[float] = None, verbose: Optional[int] = None, **launcher_options) -> List[Any]:
    """Run `fn(*args, **kwargs)` on `np` ranks; return the list of its return values, in rank order.

    Args:
        fn: what each rank calls, as `fn(*args, **kwargs)`; cloudpickled with its arguments, so a
            function of `__main__`, of a notebook cell or a closure will do. The ranks call
            `hvd.init()` themselves.
        args: the positional arguments of `fn`.
        kwargs: its keyword arguments.
        np: the number of ranks (of the first launch, for an elastic job). By default, inside a
            Slurm allocation (`salloc`, `sbatch`) and without `hosts` or `hostfile`, one rank per
            task slot of the allocation, on its hosts; elsewhere 1, as Horovod's.
        hosts: "host:slots,..." (or a list of "host:slots"), as hvdplusrun's -H.
        hostfile: as hvdplusrun's --hostfile.
        min_np: makes the job elastic, as hvdplusrun's flag does: `fn` should then train through
            `hvd.elastic.run`, and the list holds the ranks of the job as it ended.
        max_np: the most ranks an elastic job may grow to.
        env: variables for the ranks, on top of this process's environment.
        start_timeout: for an elastic job, how long a launch waits for --min-np usable slots
            (hvdplusrun's --elastic-timeout); a job that is not elastic waits for nothing.
        verbose: 2 or more prints the mpirun command line.
        launcher_options: any other hvdplusrun option, by its name with underscores
            (`fusion_threshold_mb=32`, `network_interface="eth0"`, `in_place=False`).

    Raises:
        RanksRaisedError: ranks raised; it names every one, with its exception and traceback.
            The job ends within seconds of the first one, however long the others compute.
        RuntimeError: the job failed otherwise (a rank died, mpirun failed); its output says why.
        KeyboardInterrupt: Ctrl-C (SIGINT), after every rank has ended.
    """
    host_list = ",".join(hosts) if isinstance(hosts, (list, tuple)) else hosts
    if np is None and not host_list and not hostfile and find_allocation(os.environ) is None:
        np = 1
    options = dict(launcher_options, num_proc=np, hosts=host_list, hostfile=hostfile, min_np=min_np,
                   max_np=max_np, verbose=bool(verbose and verbose >= 2))
    if start_timeout is not None:
        options["elastic_timeout"] = start_timeout
    return run_with_launcher(fn, args, kwargs, launcher_flags(options), env)


def run_with_launcher(fn: Callable, args: Sequence, kwargs: Optional[Dict[str, Any]], flags: List[str],
                      env: Optional[Dict[str, str]]) -> List[Any]:
    """`run`, for a job that hvdplusrun's `flags` describe (hvdplus.ray adds its own)."""
    argv = flags + ["--no-exit-guard", sys.executable, "-m", "hvdplus.run_rank"]
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    served = len(payload) > function_payload.ENVIRONMENT_BYTES
    launcher_args = parse_args(argv)
    hosts = job_hosts(launcher_args)
    host_names = [host.name for host in hosts]
    try:
        with JobChannel(payload if served else None, on_this_machine(hosts), host_names) as channel, \
                stopping_on_signals():
            results = _Results(channel)
            ranks_env = {**(env or {}), **channel.env, **({} if served else function_payload.to_environment(payload))}
            io = JobIO(on_message=results.take, env=ranks_env, failures=results.failures)
            status = launch(launcher_args, io)
    except Stopped as stop:
        if stop.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(stop.exit_status) from None
    except LaunchError as error:
        raise RuntimeError(f"hvdplus.run could not start the job: {error}") from None
    raised = results.failures.raised()
    if raised:
        files = source_files(fn)  # the ranks had `fn` without them (dynamic_code)
        raise RanksRaisedError({rank: restore_sources(failure, files) for rank, failure in raised.items()}, status)
    values = results.values()
    if status != 0 or not values or sorted(values) != list(range(len(values))):
        raise RuntimeError(f"hvdplus.run: the job ended with exit status {status}, and returned from ranks "
                           f"{sorted(values)}; its output above says what went wrong "
                           f"(launched as: hvdplusrun {shlex.join(argv)})")
    return [values[rank] for rank in range(len(values))]
