"""Jobs on a real Slurm (Debian's 22.05) whose controller and three compute nodes are podman
containers, each a host, with no ssh client or server in any (tests/testkit/slurm_cluster.py
builds and removes them)."""

import json

import numpy as np
import pytest

from testkit import cluster, slurm_cluster

pytestmark = cluster.container_test_marks()


@pytest.fixture(scope="module")
def slurm_image():
    slurm_cluster.build_image()


@pytest.fixture
def slurm(slurm_image, tmp_path):
    with slurm_cluster.SlurmCluster(3, str(tmp_path)) as made:
        yield made


def test_mpirun_in_a_batch_job_starts_its_ranks_on_the_allocated_hosts_through_slurm(slurm):
    for host in [slurm.controller, *slurm.nodes]:
        assert slurm.run("sh", "-c", "command -v ssh", host=host).returncode != 0, f"{host} has an ssh client"
    # No -np and no -H: Open MPI's mpirun reads the allocation from Slurm and starts its
    # daemons on the other nodes with srun.
    job = slurm.submit(f"#!/bin/bash\nmpirun python {slurm_cluster.JOBS}/allreduce_across_hosts.py\n",
                       "--nodes=3", "--ntasks-per-node=1")
    fields = slurm.wait_for_job(job, timeout=180)
    output = slurm.output(job)
    assert fields["JobState"] == "COMPLETED", f"{fields['JobState']}, exit code {fields['ExitCode']}:\n{output}"
    ranks = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    expected = sum(np.arange(4.0) * (rank + 1) for rank in range(3))
    assert sorted(rank["rank"] for rank in ranks) == [0, 1, 2], output
    assert sorted(rank["host"] for rank in ranks) == slurm.nodes, output
    for rank in ranks:
        assert rank["size"] == 3, output
        np.testing.assert_array_equal(rank["sum"], expected)
