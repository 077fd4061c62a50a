"""The pods of deploy/kubernetes' manifests run for real, as podman containers on one machine,
each given what Kubernetes (and the MPI Operator) would give it: the manifest's image, command,
variables and user, the mounted files, and `<pod>.<service>` names in /etc/hosts
(tests/testkit/kubernetes_pods.py). The image has no ssh client or server, and nothing runs as
root: mpirun starts its daemons through `hvdplus agent` in each pod. An elastic job, given the pods
by a pod list in the API's JSON (--pod-list-file), shrinks when a pod goes and grows when one joins."""

import itertools
import json
import os
import shutil
import time

import numpy as np
import pytest

from testkit import cluster, kubernetes_pods, preparations
from testkit.training_logs import final_result, read_step_log

pytestmark = cluster.container_test_marks()

JOBS = os.path.join(cluster.REPO, "tests", "containers")
AGENT_PORT = 7075


@pytest.fixture(scope="module")
def kubernetes_image(run_folder):
    """Built in the background from the session's start (testkit/preparations.py)."""
    preparations.result("kubernetes_image", run_folder)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The folder each pod sees at /workspace, where the manifests' program train.py is."""
    folder = tmp_path_factory.mktemp("workspace")
    os.chmod(folder, 0o755)
    return folder


def use_program(workspace, name):
    shutil.copy(os.path.join(JOBS, name), os.path.join(workspace, "train.py"))
    os.chmod(os.path.join(workspace, "train.py"), 0o644)


def start_pods(pods, tmp_path_factory, workspace, shared=None):
    network = kubernetes_pods.PodNetwork(pods, str(tmp_path_factory.mktemp("pods")), str(workspace), shared)
    try:
        network.start_servers()
        network.wait_until_ready(AGENT_PORT)
    except BaseException:
        network.remove()
        raise
    return network


@pytest.fixture
def indexed_job(kubernetes_image, tmp_path_factory, workspace):
    # Fresh pods for each test: once pod 0's launcher has succeeded, the other pods' agents end.
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


def test_every_pod_of_the_indexed_job_exits_0_once_the_launcher_has_without_success_policy(
        kubernetes_image, tmp_path_factory, workspace):
    # successPolicy is alpha in Kubernetes 1.30 and off there: the Job completes only when every
    # index has, so pod 0 tells the other agents, over the keyed session, that its launcher is done.
    assert "successPolicy" not in kubernetes_pods.load_manifest("indexed-job/job.yaml")["Job"]["spec"]
    pods = kubernetes_pods.indexed_job_pods(kubernetes_pods.new_key())
    network = kubernetes_pods.PodNetwork(pods, str(tmp_path_factory.mktemp("pods")), str(workspace))
    agents = {}
    try:
        # Each agent in the foreground of its `podman exec`, whose status is the agent's.
        agents = {pod.name: network.start(pod.name, *pod.command) for pod in pods if pod.serves}
        network.wait_until_ready(AGENT_PORT)
        use_program(workspace, "kubernetes/allreduce_job.py")
        result = network.run_launcher()
        ranks, output = rank_lines(result)
        assert_allreduce(ranks, output, list(network.pods))
        assert "could not tell" not in result.stderr, output
        for name, agent in agents.items():
            agent_output = agent.communicate(timeout=60)[0]
            assert agent.returncode == 0, f"{name}: {agent_output[-4000:]}"
            assert "pod 0's launcher finished" in agent_output, f"{name}: {agent_output[-4000:]}"
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
        network.remove()


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


@pytest.fixture
def shared_folder(tmp_path):
    """A folder every pod may write, as a ReadWriteMany volume: the training logs and the pod list."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    return folder


def wait_for(condition, what, job, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        ended = job.poll() is not None
        if ended or time.monotonic() > deadline:
            job.kill()
            problem = "the job ended first" if ended else f"not within {timeout} s"
            raise AssertionError(f"{what}: {problem}\n{job.communicate()[0][-8000:]}")
        time.sleep(0.2)


def test_the_indexed_job_shrinks_and_grows_with_the_pod_list(kubernetes_image, tmp_path_factory, workspace,
                                                             shared_folder):
    # The launcher reads the pod list from a file (--pod-list-file), in the API's JSON as
    # `kubectl get pods -o json` prints it, written here as Kubernetes would show the pods.
    key = kubernetes_pods.new_key()
    pods = kubernetes_pods.indexed_job_pods(key)
    launcher, worker, lost = (pod.name for pod in pods)
    network = start_pods(pods, tmp_path_factory, workspace, str(shared_folder))
    try:
        use_program(workspace, "resumable_training.py")
        pod_list, logs = os.path.join(shared_folder, "pods.json"), os.path.join(shared_folder, "logs")
        network.write_pod_list(pod_list, network.pod_list([launcher, worker, lost]))
        agent = network.pods[launcher].command
        shared = kubernetes_pods.SHARED
        job = network.start(launcher, *agent[:agent.index("--") + 1], "hvdplusrun", "--min-np", "2", "--max-np", "3",
                            "--pod-list-file", f"{shared}/pods.json", "python", "/workspace/train.py",
                            "--steps", "60", "--step-seconds", "0.2", "--log-dir", f"{shared}/logs",
                            "--ready-file", f"{shared}/ready")
        try:
            wait_for(lambda: os.path.exists(shared_folder / "ready"), "the first step", job, 60)
            # `kubectl delete pod`: the pod is listed as terminating, then its processes are killed.
            network.write_pod_list(pod_list, network.pod_list([launcher, worker], terminating=[lost]))
            network.remove_pod(lost)
            wait_for(lambda: 2 in read_step_log(logs).sizes(), "a step on the 2 pods left", job, 60)
            # A new pod (the next index, as scaling the Job up adds): listed while not ready, then
            # Ready once its agent listens, as its readiness probe would find.
            (new,) = kubernetes_pods.indexed_job_pods(key, indexes=[3])
            network.add_pod(new)
            network.write_pod_list(pod_list, network.pod_list([launcher, worker], not_ready=[new.name]))
            network.start_servers([new.name])
            network.wait_until_ready(AGENT_PORT, names=[new.name])
            network.write_pod_list(pod_list, network.pod_list([launcher, worker, new.name]))
            output, _ = job.communicate(timeout=120)
        except BaseException:
            job.kill()
            raise
    finally:
        network.remove()
    assert job.returncode == 0, output[-8000:]
    log = read_step_log(logs)
    log.check_complete(60)
    sizes = log.sizes()
    assert [size for size, _ in itertools.groupby(sizes)] == [3, 2, 3], f"job sizes by step: {sizes}\n{output[-6000:]}"
    # A commit after every step: the one pod lost costs at most the step it was running.
    assert len(log.repeated()) <= 1, f"steps that ran twice: {log.repeated()}"
    np.testing.assert_allclose(final_result(output)["weights"], log.replayed_weights(), rtol=1e-12)
