"""Test layout: files directly under tests/ run in one process (plain `pytest`); files under
tests/mpi/ (and tests/mpi/keras/, once per Keras backend) run inside every rank of an MPI
job, which tests/test_mpi_suites.py starts file by file with 1, 2 and 3 ranks and a timeout.
They are only collected inside such a job (HVDPLUS_MPI_TESTS=1); `pytest FILE::TEST --ranks N`
starts one from here.

One-process tests that start ranks get the launcher from the `mpi_job` fixture and carry the
`mpi` marker, so `pytest -m "not mpi"` runs the rest in seconds. `slow` marks those that take
more than about 20 s, and every `mpi` test not marked `quick`: `pytest -m "not slow"` is the
quick tier, the one-process tests and a few multi-rank suites, in a few minutes.

In CI (`CI=true`) a skipped test fails the run: every test there has what it needs, so a skip
means a missing install step. docs/development.md says more."""

import os

import pytest

from testkit import rank_reports
from testkit.mpi_jobs import MpiJob, launch

IN_RANK = os.environ.get("HVDPLUS_MPI_TESTS") == "1"
collect_ignore = [] if IN_RANK else ["mpi"]


def in_xdist_worker(config) -> bool:
    """Whether this process is a pytest-xdist worker (which sets its environment only after
    this file is imported)."""
    return hasattr(config, "workerinput")


def pytest_addoption(parser):
    group = parser.getgroup("hvdplus")
    group.addoption("--ranks", type=int, default=None, metavar="N",
                    help="run the given tests/mpi files or tests inside every rank of an N-rank job, "
                         "reporting each failure with its rank")
    group.addoption("--rank-timeout", type=float, default=600, metavar="SECONDS",
                    help="with --ranks: end the job after this long (default 600)")
    group.addoption("--rank-report-dir", default=None, metavar="DIR",
                    help="inside a rank: write this rank's output and failures to DIR (set by --ranks and the "
                         "mpi_job fixture)")


def pytest_configure(config):
    folder = config.getoption("rank_report_dir")
    if folder and IN_RANK:
        config.pluginmanager.register(rank_reports.RankReporter(folder), "hvdplus_rank_reporter")


def pytest_cmdline_main(config):
    """`--ranks N`: the job's ranks run the tests; this process only reports them."""
    nranks = config.getoption("ranks")
    if nranks is None or IN_RANK:
        return None
    args = _without_option(list(config.invocation_params.args), ("--ranks", "--rank-timeout"))
    # pytest's own parse tells the paths from options' values (`-p no:cacheprovider`, `-k name`).
    paths = [arg for arg in args if arg in config.args]
    options = [arg for arg in args if arg not in config.args]
    run = rank_reports.run_suite_on_ranks(launch, nranks, paths, options,
                                          timeout=config.getoption("rank_timeout"), keep_output=True)
    print(run.describe())
    return 0 if run.ok else 1


def _without_option(args, names):
    """`args` less each `--name value` and `--name=value` of `names`."""
    kept, skip_next = [], False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in names:
            skip_next = True
        elif not arg.startswith(tuple(name + "=" for name in names)):
            kept.append(arg)
    return kept


@pytest.fixture(scope="session")
def mpich_python(run_folder):
    """The python of MPICH's environment (tests/testkit/mpich.py), built once per run, in the
    background from the session's start (tests/testkit/preparations.py)."""
    from testkit import preparations

    python, reason = preparations.result("mpich_python", run_folder)
    if python is None:
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def mpi_job():
    """The job launcher (tests/testkit/mpi_jobs.py): `mpi_job(nranks, args, env=None, timeout=240)` runs
    `args` on `nranks` ranks under hvdplusrun and ends it at the timeout;
    `mpi_job.run_pytest_on_ranks(nranks, paths)` runs pytest in every rank."""
    return MpiJob()


@pytest.fixture(scope="session")
def run_folder(request, tmp_path_factory):
    """The folder of this run that all its pytest-xdist workers share (each worker's base
    folder is made inside it), or the session's base folder when it has no workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if in_xdist_worker(request.config) else base


@pytest.fixture(scope="session", autouse=True)
def background_preparations(request, run_folder):
    """Starts the images and environments that the collected tests will need
    (tests/testkit/preparations.py), as the first test begins; under pytest-xdist every worker
    does, and the first to reach each makes it while the other waits."""
    if not IN_RANK:
        from testkit import preparations

        needed = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
        preparations.start_needed(needed, run_folder)


# The fixtures of the tests that run last, in this order: their images take long to build on a
# fresh machine, and meanwhile (in the background) the other tests run. Slurm's tests come first
# of them, as one worker runs them all (they share a cluster) while the other takes the rest.
RUN_LAST = ("slurm_image", "container_image", "kubernetes_image")

# A test whose fixture waits for a preparation may wait for all of them (they are made one after
# another), each bounded by the timeouts of its own commands: it gets this long on top of its own.
PREPARATIONS_WAIT_SECONDS = 1200


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config, items):
    # `-m "not mpi"` is only right while every test that starts jobs says so.
    unmarked = [item.nodeid for item in items
                if "mpi_job" in getattr(item, "fixturenames", ()) and item.get_closest_marker("mpi") is None]
    if unmarked:
        raise pytest.UsageError("tests that use the mpi_job fixture need the mpi marker: " + ", ".join(unmarked))

    # The quick tier: a test that starts ranks or services is slow unless marked quick.
    for item in items:
        if item.get_closest_marker("mpi") is not None and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.slow)

    def place(item):
        names = getattr(item, "fixturenames", ())
        return next((position + 1 for position, name in enumerate(RUN_LAST) if name in names), 0)

    items.sort(key=place)  # stable: within each group, the collected order
    if not IN_RANK:  # a rank's tests need no preparation, and its environment may lack their tools
        _allow_for_preparations(items)
    if in_xdist_worker(config):
        _group_for_workers(items)


def _allow_for_preparations(items):
    from testkit.preparations import PREPARATIONS

    for item in items:
        if any(name in PREPARATIONS for name in getattr(item, "fixturenames", ())):
            marker = item.get_closest_marker("timeout")
            own = marker.args[0] if marker and marker.args else _session_timeout(item.config)
            if own:
                item.add_marker(pytest.mark.timeout(own + PREPARATIONS_WAIT_SECONDS))


def _session_timeout(config) -> float:
    """pytest-timeout's timeout for tests without a marker, as it reads it."""
    given = config.getoption("timeout", None) or os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout")
    return float(given or 0)


# Under pytest-xdist (`-n 2 --dist loadgroup`, as the README runs the suite), tests run on two
# workers at once, each test wherever a worker is free, in the order above, except the tests of
# a file with a module fixture of its own (a Spark session, a Ray cluster, a Slurm cluster): one
# group per file, so that each service starts once.
def _group_for_workers(items):
    def group(item):
        path = item.nodeid.split("::")[0]
        fixtures = getattr(item, "_fixtureinfo", None)
        for definitions in (fixtures.name2fixturedefs.values() if fixtures else ()):
            if any(d.scope != "function" and d.baseid == path for d in definitions):
                return path
        return None

    for item in items:
        name = group(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))


_skipped_in_ci = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("CI") == "true" and not IN_RANK:
        _skipped_in_ci.append(f"{report.nodeid}: {report.longrepr[2] if isinstance(report.longrepr, tuple) else ''}")


def pytest_terminal_summary(terminalreporter):
    if _skipped_in_ci:
        terminalreporter.write_sep("=", "skipped with CI=true, which fails the run", red=True)
        for line in _skipped_in_ci:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    if _skipped_in_ci and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
