"""deploy/kubernetes, checked offline: every built-in kind against Kubernetes' own schemas
(kubernetes-validate --strict, which ships them), the MPIJob against the v2beta1 schema in
deploy/kubernetes/schemas, and the kustomization rendered by kubectl's kustomize. No cluster is
needed; tests/test_kubernetes.py runs the pods these manifests describe, as containers."""

import copy
import json
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest
import yaml

from testkit import kubernetes_pods

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


def mpijob_schema():
    with open(os.path.join(DEPLOY, "schemas", "mpijob-v2beta1.json")) as file:
        return json.load(file)


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


def test_the_mpijob_matches_the_v2beta1_schema():
    jsonschema.Draft202012Validator.check_schema(mpijob_schema())
    job = mpijob()
    jsonschema.validate(job, mpijob_schema(), cls=jsonschema.Draft202012Validator)
    spec = job["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    launcher_env = kubernetes_pods.env_values(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    # Open MPI 5 reads PRTE's names, not the OMPI_MCA_orte_* ones the operator sets.
    assert launcher_env["PRTE_MCA_prte_default_hostfile"] == "/etc/mpi/hostfile"
    assert launcher_env["PRTE_MCA_prte_keep_fqdn_hostnames"] == "1"
    assert launcher_env["PRTE_MCA_plm_ssh_agent"] == "hvdplus agent-connect"


@pytest.mark.parametrize("change, where", [
    (lambda job: job["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2), "replicas"),
    (lambda job: job["spec"].update(launcherCreationPolicy="WhenReady"), "WhenReady"),
    (lambda job: job["spec"].update(slotPerWorker=1), "slotPerWorker"),
    (lambda job: job["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"), "Always"),
    (lambda job: job["spec"]["mpiReplicaSpecs"].pop("Launcher"), "Launcher"),
], ids=["two-launchers", "unknown-policy", "misspelt-field", "restart-always", "no-launcher"])
def test_the_v2beta1_schema_rejects_what_the_operator_rejects(change, where):
    job = copy.deepcopy(mpijob())
    change(job)
    with pytest.raises(jsonschema.ValidationError, match=where):
        jsonschema.validate(job, mpijob_schema(), cls=jsonschema.Draft202012Validator)


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
