"""deploy/kubernetes, checked offline: every built-in kind against Kubernetes' own schemas
(kubernetes-validate --strict, which ships them), the MPIJob against the MPI Operator's own CRD
(tests/data/kubeflow.org_mpijobs.yaml) and name rule, and the kustomization rendered by kubectl's
kustomize. No cluster is needed; tests/test_kubernetes.py runs the pods these manifests describe, as containers."""

import copy
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest
import yaml

from testkit import kubernetes_pods, mpijob_crd

DEPLOY = kubernetes_pods.DEPLOY
BUILT_IN_MANIFESTS = ["indexed-job/service.yaml", "indexed-job/secret.yaml", "indexed-job/job.yaml"]
KUBERNETES_VERSION = "1.33.0"  # the oldest whose Job has successPolicy (beta in 1.31 and 1.32)


def strict_validation(path):
    # kubernetes-validate through this python: its script is on PATH only in an activated venv.
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
                           KUBERNETES_VERSION, path], capture_output=True, text=True, timeout=120)


def mpijob():
    with open(os.path.join(DEPLOY, "mpijob.yaml")) as file:
        return yaml.safe_load(file)


def write_documents(path, documents):
    with open(path, "w") as file:
        yaml.safe_dump_all(documents, file)
    return str(path)


@pytest.mark.parametrize("manifest", BUILT_IN_MANIFESTS)
def test_each_built_in_manifest_passes_strict_validation(manifest):
    result = strict_validation(os.path.join(DEPLOY, manifest))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout + result.stderr


def test_the_mpijob_pod_templates_pass_strict_validation_as_pod_templates(tmp_path):
    # The MPIJob's kind is not built in, but each replica's template is a core v1 PodTemplateSpec.
    documents = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"hvdplus-{role.lower()}"},
                  "template": spec["template"]} for role, spec in mpijob()["spec"]["mpiReplicaSpecs"].items()]
    result = strict_validation(write_documents(tmp_path / "templates.yaml", documents))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).count("passed") == 2


def test_strict_validation_rejects_a_misspelt_field(tmp_path):
    with open(os.path.join(DEPLOY, "indexed-job", "job.yaml")) as file:
        job = yaml.safe_load(file)
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["true"]
    result = strict_validation(write_documents(tmp_path / "job.yaml", [job]))
    assert result.returncode != 0 and "comand" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_mpijob_passes_the_operators_crd_and_name_rule():
    job = mpijob()
    mpijob_crd.validate_mpijob(job)
    spec = job["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    launcher_env = kubernetes_pods.env_values(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    # Open MPI 5 reads PRTE's names, not the OMPI_MCA_orte_* ones the operator sets.
    assert launcher_env["PRTE_MCA_prte_default_hostfile"] == "/etc/mpi/hostfile"
    assert launcher_env["PRTE_MCA_prte_keep_fqdn_hostnames"] == "1"
    assert launcher_env["PRTE_MCA_plm_ssh_agent"] == "hvdplus agent-connect"


@pytest.mark.parametrize("change, where", [
    (lambda job: job["spec"].update(slotPerWorker=1), "slotPerWorker"),
    (lambda job: job["spec"]["runPolicy"].update(activeDeadline=60), "activeDeadline"),
    (lambda job: job["spec"].update(mpiImplementation="OpenMPI5"), "OpenMPI5"),
    (lambda job: job["spec"].update(slotsPerWorker="one"), "one"),
    (lambda job: job["spec"].pop("mpiReplicaSpecs"), "mpiReplicaSpecs"),
    (lambda job: job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop("name"),
     "'name' is a required property"),
    (lambda job: job.update(apiVersion="kubeflow.org/v1"), "v1"),
], ids=["misspelt-field", "misspelt-run-policy-field", "unknown-implementation", "slots-not-a-number",
        "no-replica-specs", "container-without-name", "old-api-version"])
def test_the_operators_crd_rejects_a_broken_mpijob(change, where):
    job = copy.deepcopy(mpijob())
    change(job)
    with pytest.raises(jsonschema.ValidationError, match=where):
        mpijob_crd.validate_mpijob(job)


def test_the_operators_name_rule_counts_the_workers():
    job = copy.deepcopy(mpijob())
    # 63 characters in all for `<name>-worker-<replicas - 1>`: the longest name the operator takes.
    replicas = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    longest = "h" * (63 - len(f"-worker-{replicas - 1}"))
    job["metadata"]["name"] = longest
    mpijob_crd.validate_mpijob(job)
    job["metadata"]["name"] = longest + "x"
    with pytest.raises(mpijob_crd.MpiJobNameError, match=f"{longest}x-worker-{replicas - 1}"):
        mpijob_crd.validate_mpijob(job)
    # Ten workers make the last index two digits long: the name that fitted no longer does.
    job["metadata"]["name"] = longest
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 10 ** len(str(replicas - 1)) + 1
    with pytest.raises(mpijob_crd.MpiJobNameError, match="DNS-1035"):
        mpijob_crd.validate_mpijob(job)
    job["metadata"]["name"] = "Hvdplus-Train"
    with pytest.raises(mpijob_crd.MpiJobNameError, match="Hvdplus-Train"):
        mpijob_crd.validate_mpijob(job)


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="no kubectl (tests/containers/prepare_host.sh installs Debian's kubernetes-client)")
def test_the_kustomization_renders_with_its_image_pods_and_command(tmp_path):
    result = subprocess.run(["kubectl", "kustomize", DEPLOY], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert sorted(document["kind"] for document in documents) == ["Job", "Service"]
    (job,) = [document for document in documents if document["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/team/hvdplus:kubernetes"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert kubernetes_pods.env_values(job["spec"]["template"])["HVDPLUS_PODS"] == "4"
    assert container["command"] == ["hvdplus", "agent", "--hostfile", "/tmp/hvdplus/hostfile", "--"]
    assert container["args"][-3:] == ["/workspace/train.py", "--epochs", "10"]
    validation = strict_validation(write_documents(tmp_path / "rendered.yaml", documents))
    assert validation.returncode == 0, validation.stdout + validation.stderr
