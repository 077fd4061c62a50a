"""The restricted Pod Security standard, and requests and limits, checked on every pod template of
a set of manifests: a Pod's spec, a Job's or other workload's spec.template, an MPIJob's
spec.mpiReplicaSpecs.<role>.template. Each shortfall names its manifest and field, as
`manifest: field: what is wrong`.

The checks are those of Kubernetes' "restricted" profile (baseline included) that a manifest can
break: host namespaces and ports, privileged containers, added capabilities, hostPath and other
non-allowed volume types, privilege escalation, running as root, the seccomp profile, dropping
every capability.
"""

from typing import Iterator, List, Tuple

__all__ = ["pod_templates", "restricted_shortfalls", "shortfalls_of_documents"]

# Volume types the restricted profile allows.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}
RESOURCES = [("requests", "cpu"), ("requests", "memory"), ("limits", "cpu"), ("limits", "memory")]


def pod_templates(document) -> Iterator[Tuple[str, dict]]:
    """Yield (field path, pod spec) for each pod spec in one manifest document.

    Args:
        document: a manifest, as loaded from YAML.
    """
    kind, spec = document.get("kind"), document.get("spec") or {}
    if kind == "Pod":
        yield "spec", spec
    elif kind == "MPIJob":
        for role, replica in sorted((spec.get("mpiReplicaSpecs") or {}).items()):
            yield f"spec.mpiReplicaSpecs.{role}.template.spec", replica["template"]["spec"]
    elif kind == "CronJob":
        yield "spec.jobTemplate.spec.template.spec", spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "PodTemplate":
        yield "template.spec", document["template"]["spec"]
    elif "template" in spec:
        yield "spec.template.spec", spec["template"]["spec"]


def _container_shortfalls(pod, container) -> List[str]:
    pod_context = pod.get("securityContext") or {}
    context = container.get("securityContext") or {}
    shortfalls = []
    if context.get("privileged"):
        shortfalls.append("securityContext.privileged: must not be true")
    if context.get("allowPrivilegeEscalation") is not False:
        shortfalls.append("securityContext.allowPrivilegeEscalation: must be false")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        shortfalls.append("securityContext.capabilities.drop: must contain ALL")
    if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
        shortfalls.append("securityContext.capabilities.add: only NET_BIND_SERVICE is allowed")
    if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
        shortfalls.append("securityContext.runAsNonRoot: must be true (here or in the pod's)")
    if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
        shortfalls.append("securityContext.runAsUser: must not be 0")
    seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
    if seccomp.get("type") not in SECCOMP_TYPES:
        shortfalls.append("securityContext.seccompProfile.type: must be RuntimeDefault or Localhost "
                          "(here or in the pod's)")
    if any(port.get("hostPort") for port in container.get("ports") or []):
        shortfalls.append("ports.hostPort: must not be set")
    resources = container.get("resources") or {}
    for group, resource in RESOURCES:
        if resource not in (resources.get(group) or {}):
            shortfalls.append(f"resources.{group}.{resource}: must be set")
    return shortfalls


def restricted_shortfalls(pod) -> List[str]:
    """The fields of one pod spec that fall short of the restricted profile or lack requests and
    limits, each as `field: what is wrong` relative to the pod spec.

    Args:
        pod: a pod spec (the `spec` of a Pod or a pod template).
    """
    shortfalls = [f"{field}: must not be true" for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    if (pod.get("securityContext") or {}).get("runAsUser") == 0:
        shortfalls.append("securityContext.runAsUser: must not be 0")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if kinds - ALLOWED_VOLUMES:
            shortfalls.append(f"volumes[{volume['name']}]: type {sorted(kinds)} is not allowed")
    for group in ("initContainers", "containers"):
        for container in pod.get(group) or []:
            shortfalls.extend(f"{group}[{container['name']}].{shortfall}"
                              for shortfall in _container_shortfalls(pod, container))
    return shortfalls


def shortfalls_of_documents(manifest, documents) -> List[str]:
    """Every shortfall of every pod template in `documents`, as `manifest: field: what is wrong`.

    Args:
        manifest: the manifest's name, for the messages.
        documents: its documents, as loaded from YAML.
    """
    return [f"{manifest}: {document['kind']} {document['metadata']['name']}: {where}.{shortfall}"
            for document in documents if document
            for where, pod in pod_templates(document) for shortfall in restricted_shortfalls(pod)]
