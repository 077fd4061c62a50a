"""The pods of deploy/kubernetes' manifests run for real, as podman containers on one machine,
each given what Kubernetes (and the MPI Operator) would give it: the manifest's image, command,
variables and user, the mounted files, and `<pod>.<service>` names in /etc/hosts
(tests/testkit/kubernetes_pods.py). The image has no ssh client or server, and nothing runs as
root: mpirun starts its daemons through `hvdplus agent` in each pod."""

import json
import os
import shutil

import numpy as np
import pytest

from testkit import cluster, kubernetes_pods

pytestmark = cluster.container_test_marks()

JOBS = os.path.join(cluster.REPO, "tests", "containers")
AGENT_PORT = 7075


@pytest.fixture(scope="module")
def kubernetes_image():
    kubernetes_pods.build_image()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The folder each pod sees at /workspace, where the manifests' program train.py is."""
    folder = tmp_path_factory.mktemp("workspace")
    os.chmod(folder, 0o755)
    return folder


def use_program(workspace, name):
    shutil.copy(os.path.join(JOBS, name), os.path.join(workspace, "train.py"))
    os.chmod(os.path.join(workspace, "train.py"), 0o644)


def start_pods(pods, tmp_path_factory, workspace):
    network = kubernetes_pods.PodNetwork(pods, str(tmp_path_factory.mktemp("pods")), str(workspace))
    try:
        network.start_servers()
        network.wait_until_ready(AGENT_PORT)
    except BaseException:
        network.remove()
        raise
    return network


@pytest.fixture(scope="module")
def indexed_job(kubernetes_image, tmp_path_factory, workspace):
    network = start_pods(kubernetes_pods.indexed_job_pods(kubernetes_pods.new_key()), tmp_path_factory, workspace)
    yield network
    network.remove()


@pytest.fixture(scope="module")
def mpijob(kubernetes_image, tmp_path_factory, workspace):
    network = start_pods(kubernetes_pods.mpijob_pods(kubernetes_pods.new_key()), tmp_path_factory, workspace)
    yield network
    network.remove()


def rank_lines(result):
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    # hvdplusrun tags each line with its rank ("[1,0]<stdout>: "); plain mpirun does not.
    lines = [json.loads(text[text.index("{"):]) for text in result.stdout.splitlines() if '{"rank"' in text]
    return {line["rank"]: line for line in lines}, output


def assert_allreduce(ranks, output, hosts):
    """Rank i ran on hosts[i] and got numpy's sum."""
    expected = sum(np.arange(4.0) * (rank + 1) for rank in range(len(hosts)))
    assert {rank: line["host"] for rank, line in ranks.items()} == dict(enumerate(hosts)), output
    for line in ranks.values():
        assert line["size"] == len(hosts), output
        np.testing.assert_array_equal(line["sum"], expected)


def test_the_indexed_job_forms_a_three_rank_job_without_ssh_or_root(indexed_job, workspace):
    for pod in indexed_job.pods:
        check = indexed_job.run(pod, "sh", "-c", "command -v ssh || command -v sshd || test $(id -u) = 0")
        assert check.returncode != 0, f"{pod} has ssh or runs as root: {check.stdout}"
    use_program(workspace, "kubernetes/allreduce_job.py")
    ranks, output = rank_lines(indexed_job.run_launcher())
    assert_allreduce(ranks, output, list(indexed_job.pods))


def test_the_indexed_job_trains_torch_as_one_process_would(indexed_job, workspace):
    use_program(workspace, "torch_job.py")  # it checks the weights against one process's itself
    result = indexed_job.run_launcher()
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    for rank, pod in enumerate(indexed_job.pods):
        assert f"trained {rank} on {pod}" in result.stdout, result.stdout[-6000:]


def test_the_mpijob_puts_its_ranks_on_the_workers_never_on_the_launcher(mpijob, workspace):
    use_program(workspace, "kubernetes/allreduce_job.py")
    workers = [pod for pod, spec in mpijob.pods.items() if spec.serves]
    ranks, output = rank_lines(mpijob.run_launcher())
    assert_allreduce(ranks, output, workers)


def test_plain_mpirun_in_the_mpijob_launcher_reads_the_prte_hostfile_variable(mpijob, workspace):
    # No hostfile or -H on the command line: Open MPI 5 reads PRTE_MCA_prte_default_hostfile
    # (the operator's OMPI_MCA_orte_default_hostfile alone would leave every rank on the launcher).
    use_program(workspace, "kubernetes/allreduce_job.py")
    (launcher,) = [pod for pod, spec in mpijob.pods.items() if not spec.serves]
    workers = [pod for pod in mpijob.pods if pod != launcher]
    ranks, output = rank_lines(mpijob.run(launcher, "mpirun", "python", "/workspace/train.py", timeout=120))
    assert_allreduce(ranks, output, workers)
