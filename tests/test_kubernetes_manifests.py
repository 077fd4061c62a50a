"""deploy/kubernetes, checked offline: every built-in kind against Kubernetes' own schemas
(kubernetes-validate, strict, which ships them) for the oldest supported Kubernetes (1.29) and the
newest it knows; the MPIJob against the MPI Operator's own CRD (tests/data/kubeflow.org_mpijobs.yaml)
and name rule; every pod template against the restricted Pod Security standard, with requests and
limits; and both kustomizations as kustomize renders them. No cluster is needed;
tests/test_kubernetes.py runs the pods these manifests describe, as containers."""

import copy
import glob
import os
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from testkit import kubernetes_pods, mpijob_crd, pod_security

DEPLOY = kubernetes_pods.DEPLOY
BUILT_IN_MANIFESTS = ["indexed-job/service.yaml", "indexed-job/secret.yaml", "indexed-job/job.yaml",
                      "indexed-job/network-policy.yaml", "mpijob/network-policy.yaml"]
# The oldest Kubernetes the manifests support, and the newest kubernetes-validate has schemas of.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
KUSTOMIZATIONS = {".": ["Job", "NetworkPolicy", "Service"], "mpijob": ["MPIJob", "NetworkPolicy"]}
RENDERED_IMAGE = "registry.example.com/team/hvdplus:kubernetes"


def documents_of(path):
    with open(path) as file:
        return [document for document in yaml.safe_load_all(file) if document]


def every_manifest():
    """{path relative to DEPLOY: documents} of every Kubernetes manifest there (not kustomize's own
    files: kustomizations, their patches and transformer settings)."""
    paths = sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True))
    manifests = {os.path.relpath(path, DEPLOY): documents_of(path) for path in paths}
    return {path: documents for path, documents in manifests.items()
            if all(isinstance(document, dict) and document.get("apiVersion")
                   and document.get("kind") != "Kustomization" for document in documents)}


def strict_failures(documents, version):
    """The documents kubernetes-validate refuses, strictly, for `version`, with its reasons."""
    failures = []
    for document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{document['kind']} {document['metadata']['name']}: {error.message} at "
                            f"{'.'.join(str(part) for part in error.path)}")
    return failures


def mpijob():
    return documents_of(os.path.join(DEPLOY, "mpijob", "mpijob.yaml"))[0]


def as_pod_templates(job):
    # The MPIJob's kind is not built in, but each replica's template is a core v1 PodTemplateSpec.
    return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"hvdplus-{role.lower()}"},
             "template": spec["template"]} for role, spec in job["spec"]["mpiReplicaSpecs"].items()]


def render(kustomization):
    """The documents kustomize renders of deploy/kubernetes/`kustomization`: with kustomize if
    installed, else with kubectl's."""
    command = (["kustomize", "build"] if shutil.which("kustomize") else ["kubectl", "kustomize"])
    result = subprocess.run([*command, os.path.join(DEPLOY, kustomization)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


needs_kustomize = pytest.mark.skipif(
    shutil.which("kubectl") is None and shutil.which("kustomize") is None,
    reason="no kubectl (tests/containers/prepare_host.sh installs Debian's kubernetes-client)")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", BUILT_IN_MANIFESTS)
def test_each_built_in_manifest_passes_strict_validation(manifest, version):
    documents = documents_of(os.path.join(DEPLOY, manifest))
    assert documents and strict_failures(documents, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_mpijob_pod_templates_pass_strict_validation_as_pod_templates(version):
    assert strict_failures(as_pod_templates(mpijob()), version) == []


def test_every_manifest_here_is_checked():
    # A manifest added to deploy/kubernetes and left out of the lists above fails here.
    kinds = {path: sorted(document["kind"] for document in documents) for path, documents in every_manifest().items()}
    assert kinds == {**{manifest: kinds[manifest] for manifest in BUILT_IN_MANIFESTS}, "mpijob/mpijob.yaml": ["MPIJob"]}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strict_validation_rejects_a_misspelt_field(version):
    (job,) = documents_of(os.path.join(DEPLOY, "indexed-job", "job.yaml"))
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["true"]
    (failure,) = strict_failures([job], version)
    assert "comand" in failure


def test_the_indexed_job_needs_no_success_policy_and_survives_a_drain():
    (job,) = documents_of(os.path.join(DEPLOY, "indexed-job", "job.yaml"))
    spec = job["spec"]
    # successPolicy is alpha in 1.30 (off by default): the agents end the pods instead.
    assert "successPolicy" not in spec
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    # Kubernetes takes a podFailurePolicy only with restartPolicy Never.
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] > 0 and spec["ttlSecondsAfterFinished"] >= 0


def test_both_ways_have_deadlines_and_distinct_service_names():
    run_policy = mpijob()["spec"]["runPolicy"]
    assert run_policy["activeDeadlineSeconds"] > 0 and run_policy["ttlSecondsAfterFinished"] >= 0
    (service,) = documents_of(os.path.join(DEPLOY, "indexed-job", "service.yaml"))
    # The operator names the MPIJob's Service after the job.
    assert service["metadata"]["name"] != mpijob()["metadata"]["name"]


def test_every_pod_template_meets_the_restricted_standard_with_requests_and_limits():
    manifests = every_manifest()
    templates = [where for documents in manifests.values() for document in documents
                 for where, _ in pod_security.pod_templates(document)]
    # The Indexed Job's template and the MPIJob's launcher and worker.
    assert len(templates) == 3, templates
    assert [shortfall for path, documents in manifests.items()
            for shortfall in pod_security.shortfalls_of_documents(path, documents)] == []


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


@pytest.mark.parametrize("change, shortfalls", [
    (lambda pod: pod["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
     ["containers[launcher].securityContext.allowPrivilegeEscalation: must be false"]),
    (lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
     ["containers[launcher].securityContext.capabilities.drop: must contain ALL"]),
    (lambda pod: pod["securityContext"].pop("seccompProfile"),
     ["containers[launcher].securityContext.seccompProfile.type: must be RuntimeDefault or Localhost "
      "(here or in the pod's)"]),
    (lambda pod: pod["securityContext"].update(runAsNonRoot=False),
     ["containers[launcher].securityContext.runAsNonRoot: must be true (here or in the pod's)"]),
    (lambda pod: pod["containers"][0]["resources"].pop("limits"),
     ["containers[launcher].resources.limits.cpu: must be set",
      "containers[launcher].resources.limits.memory: must be set"]),
    (lambda pod: pod.update(hostNetwork=True), ["hostNetwork: must not be true"]),
    (lambda pod: pod.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": "/"}}),
     ["volumes[host]: type ['hostPath'] is not allowed"]),
], ids=["escalation", "capabilities", "seccomp", "root", "limits", "host-network", "host-path"])
def test_the_restricted_check_names_the_manifest_and_the_field(change, shortfalls):
    job = mpijob()
    change(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"])
    where = "mpijob/mpijob.yaml: MPIJob hvdplus-mpijob: spec.mpiReplicaSpecs.Launcher.template.spec"
    assert pod_security.shortfalls_of_documents("mpijob/mpijob.yaml", [job]) == [
        f"{where}.{shortfall}" for shortfall in shortfalls]


@needs_kustomize
@pytest.mark.parametrize("kustomization", sorted(KUSTOMIZATIONS))
def test_each_kustomization_renders_valid_restricted_manifests_with_its_image(kustomization):
    documents = render(kustomization)
    assert sorted(document["kind"] for document in documents) == KUSTOMIZATIONS[kustomization]
    images = [container["image"] for document in documents for _, pod in pod_security.pod_templates(document)
              for container in pod["containers"]]
    assert images and set(images) == {RENDERED_IMAGE}
    built_in = [document for document in documents if document["kind"] != "MPIJob"]
    for version in KUBERNETES_VERSIONS:
        assert strict_failures(built_in, version) == [], version
    for job in [document for document in documents if document["kind"] == "MPIJob"]:
        mpijob_crd.validate_mpijob(job)
        assert strict_failures(as_pod_templates(job), KUBERNETES_VERSIONS[0]) == []
    assert pod_security.shortfalls_of_documents(f"rendered {kustomization}", documents) == []


@needs_kustomize
def test_the_indexed_job_kustomization_sets_pods_and_command():
    (job,) = [document for document in render(".") if document["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert kubernetes_pods.env_values(job["spec"]["template"])["HVDPLUS_PODS"] == "4"
    assert container["command"] == ["hvdplus", "agent", "--hostfile", "/tmp/hvdplus/hostfile", "--"]
    assert container["args"][-3:] == ["/workspace/train.py", "--epochs", "10"]


def test_each_network_policy_admits_exactly_its_own_jobs_pods():
    for job_path, policy_path, labels_of in [
            ("indexed-job/job.yaml", "indexed-job/network-policy.yaml",
             lambda job: [job["spec"]["template"]["metadata"]["labels"]]),
            ("mpijob/mpijob.yaml", "mpijob/network-policy.yaml",
             lambda job: [spec["template"]["metadata"]["labels"] for spec in job["spec"]["mpiReplicaSpecs"].values()])]:
        (job,) = documents_of(os.path.join(DEPLOY, job_path))
        (policy,) = documents_of(os.path.join(DEPLOY, policy_path))
        selector = policy["spec"]["podSelector"]["matchLabels"]
        # Every pod of the job is selected, and admits from every pod of the job, on any port.
        for labels in labels_of(job):
            assert selector.items() <= labels.items(), (policy_path, labels)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        assert rule == {"from": [{"podSelector": {"matchLabels": selector}}]}, policy_path
    # The two jobs' pods are told apart.
    selectors = [documents_of(os.path.join(DEPLOY, path))[0]["spec"]["podSelector"]["matchLabels"]
                 for path in ("indexed-job/network-policy.yaml", "mpijob/network-policy.yaml")]
    assert selectors[0] != selectors[1]
