"""The pods of deploy/kubernetes' manifests as podman containers on one machine, given what
Kubernetes (and the MPI Operator, for the MPIJob) would give them: the image, the manifest's
command, environment and user, the mounted Secret and ConfigMap files, and host names
`<pod>.<service>` in /etc/hosts. No Kubernetes control plane runs here, so this module plays the
parts of the kubelet and the operator that the pods can see, reading the manifests as they stand.

The image is deploy/kubernetes/Containerfile's (the test image without ssh). Every container and
the network are removed at the end, whatever happens. For an elastic job, pods can be removed and
added while it runs, and `pod_list` writes what the API would list of them.
"""

import dataclasses
import datetime
import json
import os
import secrets
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional, Sequence

import yaml

from testkit import cluster

__all__ = ["DEPLOY", "IMAGE", "SHARED", "PodSpec", "PodNetwork", "build_image", "env_values", "indexed_job_pods",
           "mpijob_pods", "load_manifest"]

DEPLOY = os.path.join(cluster.REPO, "deploy", "kubernetes")
IMAGE = "localhost/hvdplus:kubernetes"
NAMESPACE = "default"
# Where each pod finds the training program the manifests run (/workspace/train.py).
WORKSPACE = "/workspace"
# Where a folder that every pod may write is mounted, as a ReadWriteMany volume would be.
SHARED = "/shared"


def build_image():
    """Build IMAGE from deploy/kubernetes/Containerfile over the test image (podman's cache
    keeps each step that has not changed)."""
    cluster.build_image()
    cluster.podman("build", "--format", "docker", "--build-arg", f"BASE_IMAGE={cluster.IMAGE}",
                   "-f", os.path.join(DEPLOY, "Containerfile"), "-t", IMAGE, DEPLOY, timeout=1800)


def load_manifest(relative_path):
    """The documents of the manifest at deploy/kubernetes/`relative_path`, by kind."""
    with open(os.path.join(DEPLOY, relative_path)) as file:
        return {document["kind"]: document for document in yaml.safe_load_all(file)}


def env_values(template) -> Dict[str, str]:
    """The plain `value` variables of a pod template's first container."""
    return {item["name"]: item["value"] for item in template["spec"]["containers"][0].get("env", [])
            if "value" in item}


@dataclasses.dataclass
class PodSpec:
    """One pod as its container sees it.

    Args:
        name: the pod's host name.
        dns_names: the names other pods reach it by (written to every /etc/hosts).
        command: its container's command and args.
        env: its environment.
        files: {path in the container: (text, mode)} of the mounted Secret and ConfigMap files.
        user: the user id it runs as.
        serves: whether it runs until stopped (an agent) rather than to an end (the launcher).
        subdomain: its spec's subdomain (the Service that names it).
        labels: its labels.
    """

    name: str
    dns_names: List[str]
    command: List[str]
    env: Dict[str, str]
    files: Dict[str, tuple]
    user: int
    serves: bool
    subdomain: str = ""
    labels: Dict[str, str] = dataclasses.field(default_factory=dict)


def _container(template):
    spec = template["spec"]
    container = spec["containers"][0]
    return container, container.get("command", []) + container.get("args", []), spec["securityContext"]["runAsUser"]


def indexed_job_pods(key: bytes, indexes: Optional[Sequence[int]] = None) -> List[PodSpec]:
    """The pods of deploy/kubernetes/indexed-job, with `key` in the Secret they mount: those of
    `indexes`, by default of every index up to its parallelism (a larger index is a pod that
    scaling an elastic Indexed Job's completions and parallelism up adds)."""
    job = load_manifest("indexed-job/job.yaml")["Job"]
    service = load_manifest("indexed-job/service.yaml")["Service"]["metadata"]["name"]
    template = job["spec"]["template"]
    assert template["spec"]["subdomain"] == service
    container, command, user = _container(template)
    (mount,) = container["volumeMounts"]
    (volume,) = [volume for volume in template["spec"]["volumes"] if volume["name"] == mount["name"]]
    secret = load_manifest("indexed-job/secret.yaml")["Secret"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    files = {f"{mount['mountPath']}/{name}": (key.decode(), 0o440) for name in secret["stringData"]}
    pods = []
    for index in range(job["spec"]["parallelism"]) if indexes is None else indexes:
        name = f"{job['metadata']['name']}-{index}"
        # Kubernetes gives each pod of an Indexed Job its index, as a variable and as labels.
        env = dict(env_values(template), JOB_COMPLETION_INDEX=str(index))
        labels = dict(template["metadata"]["labels"], **{"job-name": job["metadata"]["name"],
                                                          "batch.kubernetes.io/job-completion-index": str(index)})
        pods.append(PodSpec(name, [f"{name}.{service}"], command, env, files, user, serves=index != 0,
                            subdomain=service, labels=labels))
    return pods


def mpijob_pods(key: bytes, worker_replicas: Optional[int] = None) -> List[PodSpec]:
    """The launcher and workers of deploy/kubernetes/mpijob/mpijob.yaml, with what the MPI Operator
    (v2beta1, Open MPI) adds: its variables, the hostfile and discover_hosts.sh in /etc/mpi of
    the launcher, and the job's ssh key Secret (its private key `key`) at sshAuthMountPath."""
    job = load_manifest("mpijob/mpijob.yaml")["MPIJob"]
    spec, name = job["spec"], job["metadata"]["name"]
    slots = spec.get("slotsPerWorker", 1)
    workers = worker_replicas or spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    worker_names = [f"{name}-worker-{index}" for index in range(workers)]
    fqdn = {pod: f"{pod}.{name}.{NAMESPACE}.svc" for pod in [f"{name}-launcher", *worker_names]}
    ssh_files = {f"{spec['sshAuthMountPath']}/{file}": (text, 0o644) for file, text in
                 {"id_rsa": key.decode(), "id_rsa.pub": "unused\n", "authorized_keys": "unused\n"}.items()}
    hostfile = "".join(f"{fqdn[pod]} slots={slots}\n" for pod in worker_names)
    discover = "#!/bin/sh\n" + "".join(f"echo {fqdn[pod]}\n" for pod in sorted(worker_names))
    launcher_template = spec["mpiReplicaSpecs"]["Launcher"]["template"]
    _, command, user = _container(launcher_template)
    operator_env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_set_default_slots": str(slots),
                    "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
    launcher_name = f"{name}-launcher"
    pods = [PodSpec(launcher_name, [fqdn[launcher_name], f"{launcher_name}.{name}"], command,
                    dict(env_values(launcher_template), **operator_env),
                    dict(ssh_files, **{"/etc/mpi/hostfile": (hostfile, 0o444),
                                       "/etc/mpi/discover_hosts.sh": (discover, 0o555)}), user, serves=False,
                    subdomain=name)]
    worker_template = spec["mpiReplicaSpecs"]["Worker"]["template"]
    _, worker_command, worker_user = _container(worker_template)
    for pod in worker_names:
        pods.append(PodSpec(pod, [fqdn[pod], f"{pod}.{name}"], worker_command,
                            dict(env_values(worker_template), K_MPI_JOB_ROLE="worker"), ssh_files, worker_user,
                            serves=True, subdomain=name))
    return pods


def new_key() -> bytes:
    return secrets.token_hex(32).encode()


class PodNetwork:
    """The containers of `pods` on a network of their own, each idle until `start_servers` (or
    `run`, `start`) runs its command; /etc/hosts of each names them all. `remove` removes them.

    Args:
        pods: the pods.
        workdir: a folder of this machine for their mounted files.
        workspace: a folder mounted read-only at /workspace in every pod (the training program).
        shared: a folder mounted read-write at SHARED in every pod, if given.
    """

    def __init__(self, pods: List[PodSpec], workdir: str, workspace: str, shared: Optional[str] = None):
        self.prefix = f"hvdplus-k8s-{uuid.uuid4().hex[:6]}"
        self.network = self.prefix
        self.pods: Dict[str, PodSpec] = {}
        self.addresses: Dict[str, str] = {}
        self._started: List[str] = []
        self._mounts = ["-v", f"{workspace}:{WORKSPACE}:ro"] + (["-v", f"{shared}:{SHARED}"] if shared else [])
        self._workdir = workdir
        cluster.podman("network", "create", self.network)
        try:
            for pod in pods:
                self._run_container(pod)
            self.write_hosts(list(self.pods))
        except BaseException:
            self.remove()
            raise

    def container(self, pod_name: str) -> str:
        return f"{self.prefix}-{pod_name}"

    def _run_container(self, pod: PodSpec) -> None:
        mounts = self._write_files(pod, os.path.join(self._workdir, pod.name))
        cluster.podman("run", "-d", "--init", "--name", self.container(pod.name), "--hostname", pod.name,
                       "--network", self.network, "--user", str(pod.user), *mounts, *self._mounts,
                       "--entrypoint", "sleep", IMAGE, "infinity")
        self._started.append(pod.name)
        self.pods[pod.name] = pod
        self.addresses[pod.name] = cluster.podman(
            "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            self.container(pod.name)).stdout.strip()

    def add_pod(self, pod: PodSpec) -> None:
        """Start `pod`'s container, idle, named in every pod's /etc/hosts and naming them all in
        its own, as a pod that joins the job's Service."""
        self._run_container(pod)
        self.write_hosts([name for name in self.pods if name != pod.name], into=[pod.name])
        self.write_hosts([pod.name])

    def remove_pod(self, pod_name: str) -> None:
        """Kill `pod_name`'s container at once and remove it, as a lost node or a deleted pod
        whose processes are killed."""
        cluster.podman("rm", "-f", "-t", "0", self.container(pod_name))
        self._started.remove(pod_name)
        del self.pods[pod_name]

    def pod_list(self, ready: Sequence[str], not_ready: Sequence[str] = (), terminating: Sequence[str] = ()) -> dict:
        """The PodList that `kubectl get pods -o json` prints for these pods: those of `ready`
        Running and Ready; those of `not_ready` Running with their containers not yet ready;
        those of `terminating` deleted but not yet gone (a deletionTimestamp, still Ready)."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        def item(name, is_ready, deleted):
            pod = self.pods[name]
            metadata = {"name": f"{name}-{uuid.uuid5(uuid.NAMESPACE_DNS, name).hex[:5]}", "namespace": NAMESPACE,
                        "labels": pod.labels, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, self.container(name))),
                        "creationTimestamp": now}
            if deleted:
                metadata.update(deletionTimestamp=now, deletionGracePeriodSeconds=30)
            condition = "True" if is_ready else "False"
            conditions = [{"type": kind, "status": status, "lastTransitionTime": now} for kind, status in
                          [("PodReadyToStartContainers", "True"), ("Initialized", "True"),
                           ("Ready", condition), ("ContainersReady", condition), ("PodScheduled", "True")]]
            address = self.addresses[name]
            return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                    "spec": {"hostname": name, "subdomain": pod.subdomain, "restartPolicy": "Never",
                             "containers": [{"name": "hvdplus", "image": IMAGE, "command": pod.command}]},
                    "status": {"phase": "Running", "conditions": conditions, "podIP": address,
                               "podIPs": [{"ip": address}], "startTime": now}}

        items = [item(name, True, False) for name in ready] + [item(name, False, False) for name in not_ready] + \
            [item(name, True, True) for name in terminating]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}

    @staticmethod
    def write_pod_list(path: str, pod_list: dict) -> None:
        """Replace the file `path` with `pod_list`'s JSON whole, as `kubectl get pods -o json > new &&
        mv new path` does, so that its reader never sees half of it."""
        with open(f"{path}.new", "w") as file:
            json.dump(pod_list, file, indent=4)
        os.chmod(f"{path}.new", 0o644)
        os.replace(f"{path}.new", path)

    @staticmethod
    def _write_files(pod: PodSpec, folder: str) -> List[str]:
        """Each mounted folder of `pod`'s files, made in `folder`; podman's -v options for them."""
        by_mount: Dict[str, Dict[str, tuple]] = {}
        for path, content in pod.files.items():
            by_mount.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = content
        options = []
        for number, (mount, files) in enumerate(sorted(by_mount.items())):
            source = os.path.join(folder, str(number))
            os.makedirs(source)
            os.chmod(source, 0o755)
            os.chmod(folder, 0o755)
            for name, (text, mode) in files.items():
                with open(os.path.join(source, name), "w") as file:
                    file.write(text)
                os.chmod(os.path.join(source, name), mode)
                # Kubernetes' fsGroup makes the files the pod user's group's.
                os.chown(os.path.join(source, name), 0, pod.user)
            options += ["-v", f"{source}:{mount}:ro"]
        return options

    def write_hosts(self, names: List[str], into: Optional[List[str]] = None) -> None:
        """Each of `names`' pods' DNS names and address in the /etc/hosts of the pods `into`, by
        default of every pod."""
        lines = "".join(f"{self.addresses[name]} {' '.join(self.pods[name].dns_names)}\n" for name in names)
        for name in self._started if into is None else into:
            cluster.podman("exec", "-u", "root", self.container(name), "sh", "-c",
                           f"printf '%s' '{lines}' >> /etc/hosts")

    def _exec_args(self, pod: PodSpec) -> List[str]:
        env = [word for key, value in pod.env.items() for word in ("-e", f"{key}={value}")]
        return ["-u", str(pod.user), "-w", "/home/hvd", *env, self.container(pod.name), *pod.command]

    def start_servers(self, names: Optional[Sequence[str]] = None) -> None:
        """Run the command of every pod that serves (the agents), or of those of `names`, in the
        background."""
        for pod in self.pods.values():
            if pod.serves and (names is None or pod.name in names):
                cluster.podman("exec", "-d", *self._exec_args(pod))

    def wait_until_ready(self, port: int, timeout: float = 60, names: Optional[Sequence[str]] = None) -> None:
        """Wait until every serving pod, or each of `names`, listens on `port`: their readiness probe."""
        deadline = time.monotonic() + timeout
        for pod in self.pods.values():
            while pod.serves and (names is None or pod.name in names):
                try:
                    socket.create_connection((self.addresses[pod.name], port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{pod.name} did not listen on {port} within {timeout} s")
                    time.sleep(0.2)

    def run_launcher(self, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run the command of the pod that does not serve (the launcher) to its end."""
        (pod,) = [pod for pod in self.pods.values() if not pod.serves]
        return subprocess.run(["podman", "exec", *self._exec_args(pod)], capture_output=True, text=True,
                              timeout=timeout)

    def run(self, pod_name: str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """`command` in pod `pod_name`, as its user, with its environment."""
        pod = dataclasses.replace(self.pods[pod_name], command=list(command))
        return subprocess.run(["podman", "exec", *self._exec_args(pod)], capture_output=True, text=True,
                              timeout=timeout)

    def start(self, pod_name: str, *command: str) -> subprocess.Popen:
        """`command` in pod `pod_name`, as its user, with its environment, in the background; its
        output and errors together in the Popen's stdout."""
        pod = dataclasses.replace(self.pods[pod_name], command=list(command))
        return subprocess.Popen(["podman", "exec", *self._exec_args(pod)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def remove(self):
        for name in self._started:
            cluster.podman("rm", "-f", "-t", "0", self.container(name), check=False)
        cluster.podman("network", "rm", "-f", self.network, check=False)
