"""The fault matrix: real ranks killed (SIGKILL) at every moment of an elastic job, under
every way a job re-forms: in place (Open MPI's ULFM), by restart (`--no-in-place`), and on
MPICH, which has no failure mitigation (every failure ends the launch, and hvdplusrun
restarts it). The job is tests/elastic_jobs/numpy_train.py, which commits every step.

Every run must end with exit 0; weights equal to the numpy replay of the steps it committed;
every sample committed exactly once per epoch; at most one step done again per failure (the
commit interval); the sizes expected; and no process left running. A lost host is in
tests/test_containers.py, which kills containers.
"""

import json
import os
import sys

import pytest

from elastic_jobs import replay
from testkit.discovery import discovery_script
from testkit.mpich import mpich_job_env
from testkit.processes import assert_all_end, kill_leftovers, pids_in

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(200)]

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_jobs", "numpy_train.py")
STEPS_AT_3 = 8  # per epoch: 96 samples in batches of 4 per rank

MODES = {
    "in-place": ["--min-np", "1"],
    "restart": ["--min-np", "1", "--no-in-place"],
    "mpich": ["--min-np", "1"],
}

# (mode, victims and moments as --kill plans RANK:STEP:PHASE, failures, sizes expected: the
# size before, the size after, and the committed step from which on it holds)
FAULTS = [
    ("in-place", ["0:5:step"], 1, (3, 2, 5)),
    ("in-place", ["1:3:backward"], 1, (3, 2, 3)),
    ("in-place", ["2:4:commit"], 1, (3, 2, None)),
    ("in-place", ["1:4:step", "2:4:step"], 1, (3, 1, 4)),
    ("in-place", ["2:3:step", "0:3:sync"], 2, (3, 1, 3)),
    ("in-place", ["2:4:step", "0:4:reset"], 2, (3, 1, 4)),
    ("in-place", [f"2:{2 * STEPS_AT_3}:end"], 0, (3, 3, None)),
    ("restart", ["0:5:step"], 1, (3, 2, 5)),
    ("restart", ["1:3:backward"], 1, (3, 2, 3)),
    ("restart", ["2:4:commit"], 1, (3, 2, None)),
    ("restart", ["0:4:step", "2:4:step"], 1, (3, 1, 4)),
    ("restart", ["1:3:step", "0:0:first-sync"], 2, (3, 1, 3)),
    ("restart", ["2:4:step", "1:4:reset"], 2, (3, 1, 4)),
    ("restart", [f"2:{2 * STEPS_AT_3}:end"], 0, (3, 3, None)),
    # MPICH names no dead rank: the launcher starts the job again on every slot it has.
    ("mpich", ["0:5:step"], 1, (3, 3, None)),
    ("mpich", ["1:3:backward"], 1, (3, 3, None)),
    ("mpich", ["2:4:commit"], 1, (3, 3, None)),
    ("mpich", ["0:4:step", "1:4:step"], 1, (3, 3, None)),
    ("mpich", ["1:3:step", "0:0:first-sync"], 2, (3, 3, None)),
    ("mpich", ["2:4:step", "0:4:reset"], 2, (3, 3, None)),
    ("mpich", [f"1:{2 * STEPS_AT_3}:end"], 1, (3, 3, None)),  # a restart, which has nothing left to do
]


def fault_id(fault):
    mode, kills, _, _ = fault
    return mode + ":" + "+".join(kills)


def run_faulty_job(mpi_job, tmp_path, mode, kills, nranks=3, launcher_args=(), job_args=(), mpich_python=None):
    """The job run with `kills` in `mode`, with MPICH's python and environment for "mpich"."""
    out = str(tmp_path / "result.json")
    python, env = (mpich_python, mpich_job_env(mpich_python)) if mode == "mpich" else (sys.executable, {})
    args = [python, JOB, out, *[part for plan in kills for part in ("--kill", plan)], *job_args]
    pids = tmp_path / "result.json.pids"
    try:
        result = mpi_job(nranks, args, env=env, launcher_args=[*MODES[mode], *launcher_args], timeout=150,
                         python=python)
        output = result.stdout[-6000:] + result.stderr[-6000:]
        assert result.returncode == 0, output
        assert os.path.exists(out), output
        assert_all_end(pids_in(pids), seconds=5)
    finally:
        kill_leftovers(pids_in(pids) if pids.exists() else [])
    trained = replay.load(out)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    with open(out + ".starts") as starts:
        trained["started"] = len(starts.read().split())
    return trained, output


@pytest.mark.parametrize("fault", [fault for fault in FAULTS if fault[0] != "mpich"], ids=fault_id)
def test_a_job_loses_at_most_the_steps_since_its_last_commit(mpi_job, tmp_path, fault):
    check_loses_at_most_the_steps_since_its_last_commit(mpi_job, tmp_path, fault)


@pytest.mark.parametrize("fault", [fault for fault in FAULTS if fault[0] == "mpich"], ids=fault_id)
def test_on_mpich_a_job_loses_at_most_the_steps_since_its_last_commit(mpi_job, tmp_path, mpich_python, fault):
    check_loses_at_most_the_steps_since_its_last_commit(mpi_job, tmp_path, fault, mpich_python)


def check_loses_at_most_the_steps_since_its_last_commit(mpi_job, tmp_path, fault, mpich_python=None):
    mode, kills, failures, (before, after, at) = fault
    trained, output = run_faulty_job(mpi_job, tmp_path, mode, kills, mpich_python=mpich_python)
    sizes = replay.sizes(trained)
    redone = trained["started"] - len(sizes)
    assert 0 <= redone <= failures, f"{redone} steps done again after {failures} failures: {output}"
    assert sizes[0] == before and sizes[-1] == after and sizes == sorted(sizes, reverse=True), sizes
    if at is not None:
        assert sizes[:at] == [before] * at and set(sizes[at:]) == {after}, sizes
    if failures == 0:
        # A rank killed at the end can die while a peer still finishes the last commit's
        # collective: that peer then re-forms the job, with every step already done.
        assert trained["resets"] in ([], [before - 1]), trained["resets"]


def test_rank_0_dying_in_the_first_sync_after_growing_loses_no_commit(mpi_job, tmp_path):
    # The job grows from 2 ranks to 3 by a restart, and the new launch's rank 0 dies while it
    # hands out the commit it loaded: the other two re-form in place and take the commit from
    # their own host's disk instead of starting over.
    hosts, discover = discovery_script(tmp_path, 2)
    trained, output = run_faulty_job(
        mpi_job, tmp_path, "in-place", ["0:0:first-sync"], nranks=2,
        launcher_args=["--max-np", "3", "--host-discovery-script", str(discover)],
        job_args=["--grow", f"{hosts}:3:3", "--step-seconds", "0.1"])
    assert "restarting the job on the new slots" in output and "ranks [0] of 3 died" in output, output
    assert set(replay.sizes(trained)) == {2}, replay.sizes(trained)
    assert trained["started"] - len(trained["log"]) <= 1, "the job went back to before its last commit"


def test_an_error_while_a_peer_dies_re_forms_the_job_rather_than_end_it(mpi_job, tmp_path):
    # Open MPI's ULFM once handed a rank zeros for the object of a peer that died during the
    # collective; the job ended on the unpickling error instead of re-forming.
    out = tmp_path / "sizes.json"
    job = os.path.join(os.path.dirname(JOB), "garbled_by_the_dead.py")
    result = mpi_job(3, [sys.executable, job, str(out)], launcher_args=MODES["in-place"], timeout=120)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    assert json.loads(out.read_text()) == [2, 2], output
