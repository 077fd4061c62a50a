"""Reading Slurm's variables, without a cluster: compressed host lists and task counts, what
must fit in an allocation, srun's direct launch, the job id to requeue. tests/test_slurm.py
runs the same on a real Slurm."""

import os
import subprocess
import sys

import pytest

from hvdplus.core import slurm_steps
from hvdplus.elastic.slurm_requeue import requeue_target
from hvdplus.runner.errors import LaunchError
from hvdplus.runner.hosts import Host
from hvdplus.runner.slurm_allocation import (
    expand_host_list, expand_tasks_per_node, find_allocation, fit_to_allocation,
)


@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]),
    ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
    ("gpu[01-02],login", ["gpu01", "gpu02", "login"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
    ("a-b[1,3],c", ["a-b1", "a-b3", "c"]),
    ("n[001-003]-ib", ["n001-ib", "n002-ib", "n003-ib"]),
])
def test_host_lists(text, hosts):
    assert expand_host_list(text) == hosts


@pytest.mark.parametrize("text, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1(x2),3,2(x2)", [1, 1, 3, 2, 2])])
def test_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["n[3-1]", "n[a-b]", "n[1-2"])
def test_bad_host_lists_are_named(text):
    with pytest.raises(ValueError, match="host list"):
        expand_host_list(text)


def allocation(nodes="n[1-3,7]", tasks="2(x3),1"):
    return find_allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": nodes, "SLURM_TASKS_PER_NODE": tasks})


def test_an_allocation_is_its_hosts_with_their_slots():
    assert allocation().hosts == [Host("n1", 2), Host("n2", 2), Host("n3", 2), Host("n7", 1)]
    assert "Slurm allocation of job 42: n1:2,n2:2,n3:2,n7:1" in allocation().describe()
    assert find_allocation({"SLURM_JOB_NODELIST": "n1"}) is None
    assert find_allocation({}) is None


def test_counts_for_other_hosts_than_named_are_refused():
    with pytest.raises(LaunchError, match="names 2 hosts .* task counts for 3"):
        allocation("n[1-2]", "1(x3)")


def test_what_is_asked_must_fit_in_the_allocation():
    fit_to_allocation(allocation(), [], 7)
    fit_to_allocation(allocation(), [Host("n2", 2), Host("n7", 1)], 3)
    with pytest.raises(LaunchError, match="-np 8 is more than the 7 slots"):
        fit_to_allocation(allocation(), [], 8)
    with pytest.raises(LaunchError, match="names n9, which is not in the Slurm allocation of job 42"):
        fit_to_allocation(allocation(), [Host("n9", 1)], None)
    with pytest.raises(LaunchError, match="gives n7 2 slots, but .* has 1 tasks there"):
        fit_to_allocation(allocation(), [Host("n7", 2)], None)
    with pytest.raises(LaunchError, match="-np 4 is more than the 3 slots"):
        fit_to_allocation(allocation(), [Host("n1", 2), Host("n7", 1)], 4)


STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2"}


def test_a_task_of_srun_without_a_pmi_server_is_refused_before_mpi_starts():
    with pytest.raises(slurm_steps.SlurmLaunchError, match="task 2 of 3 of Slurm step 7.0.*libpmix-dev"):
        slurm_steps.check_before_mpi_init(STEP)
    assert slurm_steps.check_before_mpi_init({**STEP, "PMIX_RANK": "2"}).task == 2
    # mpirun's daemons run as a step of their own: their ranks are not srun's tasks.
    assert slurm_steps.check_before_mpi_init({**STEP, "OMPI_COMM_WORLD_SIZE": "6"}) is None
    # A batch script, or a step of one task, is no direct launch.
    assert slurm_steps.direct_step({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) is None
    assert slurm_steps.direct_step({**STEP, "SLURM_STEP_NUM_TASKS": "1"}) is None


def test_importing_hvdplus_sets_pmix_for_an_srun_task_before_mpi_starts():
    # The adapters import mpi4py.MPI, which starts MPI, as they load: the package's import is
    # the last moment to set what PMIx reads. A value the user set stays.
    program = ("import os, sys; import hvdplus; "
               "print(os.environ.get('PMIX_MCA_psec'), os.environ['OMPI_MCA_osc'], 'mpi4py.MPI' in sys.modules)")
    outside = {name: value for name, value in os.environ.items()
               if not name.startswith(("SLURM_", "PMIX_", "OMPI_MCA_osc"))}
    shown = [subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
             for env in ({**outside, **STEP, "PMIX_RANK": "2"}, outside,
                         {**outside, **STEP, "PMIX_RANK": "2", "PMIX_MCA_psec": "munge"})]
    assert shown == [["native", "^ucx", "False"], ["None", "^ucx", "False"], ["munge", "^ucx", "False"]]


def test_mpi_must_make_the_job_srun_made():
    step = slurm_steps.direct_step({**STEP, "PMIX_RANK": "2"})
    slurm_steps.check_after_mpi_init(step, 2, 3)
    with pytest.raises(slurm_steps.SlurmLaunchError, match="MPI made it rank 0 of 1"):
        slurm_steps.check_after_mpi_init(step, 0, 1)


def test_an_array_task_is_requeued_as_itself():
    assert requeue_target({"SLURM_JOB_ID": "101"}) == "101"
    assert requeue_target({"SLURM_JOB_ID": "103", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "3"}) == "100_3"
    assert requeue_target({}) is None
