"""The pods of deploy/kubernetes' manifests as podman containers on one machine, given what
Kubernetes (and the MPI Operator, for the MPIJob) would give them: the image, the manifest's
command, environment and user, the mounted Secret and ConfigMap files, and host names
`<pod>.<service>` in /etc/hosts. No Kubernetes control plane runs here, so this module plays the
parts of the kubelet and the operator that the pods can see, reading the manifests as they stand.

The image is deploy/kubernetes/Containerfile's (the test image without ssh). Every container and
the network are removed at the end, whatever happens.
"""

import dataclasses
import os
import secrets
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional

import yaml

from testkit import cluster

__all__ = ["DEPLOY", "IMAGE", "PodSpec", "PodNetwork", "build_image", "env_values", "indexed_job_pods",
           "mpijob_pods", "load_manifest"]

DEPLOY = os.path.join(cluster.REPO, "deploy", "kubernetes")
IMAGE = "localhost/hvdplus:kubernetes"
NAMESPACE = "default"
# Where each pod finds the training program the manifests run (/workspace/train.py).
WORKSPACE = "/workspace"


def build_image():
    """Build IMAGE from deploy/kubernetes/Containerfile over the test image (podman's cache
    keeps each step that has not changed)."""
    cluster.ensure_base_image()
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
    """

    name: str
    dns_names: List[str]
    command: List[str]
    env: Dict[str, str]
    files: Dict[str, tuple]
    user: int
    serves: bool


def _container(template):
    spec = template["spec"]
    container = spec["containers"][0]
    return container, container.get("command", []) + container.get("args", []), spec["securityContext"]["runAsUser"]


def indexed_job_pods(key: bytes) -> List[PodSpec]:
    """The pods of deploy/kubernetes/indexed-job, with `key` in the Secret they mount."""
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
    for index in range(job["spec"]["parallelism"]):
        name = f"{job['metadata']['name']}-{index}"
        # Kubernetes gives each pod of an Indexed Job its index.
        env = dict(env_values(template), JOB_COMPLETION_INDEX=str(index))
        pods.append(PodSpec(name, [f"{name}.{service}"], command, env, files, user, serves=index != 0))
    return pods


def mpijob_pods(key: bytes, worker_replicas: Optional[int] = None) -> List[PodSpec]:
    """The launcher and workers of deploy/kubernetes/mpijob.yaml, with what the MPI Operator
    (v2beta1, Open MPI) adds: its variables, the hostfile and discover_hosts.sh in /etc/mpi of
    the launcher, and the job's ssh key Secret (its private key `key`) at sshAuthMountPath."""
    job = load_manifest("mpijob.yaml")["MPIJob"]
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
                                       "/etc/mpi/discover_hosts.sh": (discover, 0o555)}), user, serves=False)]
    worker_template = spec["mpiReplicaSpecs"]["Worker"]["template"]
    _, worker_command, worker_user = _container(worker_template)
    for pod in worker_names:
        pods.append(PodSpec(pod, [fqdn[pod], f"{pod}.{name}"], worker_command,
                            dict(env_values(worker_template), K_MPI_JOB_ROLE="worker"), ssh_files, worker_user,
                            serves=True))
    return pods


def new_key() -> bytes:
    return secrets.token_hex(32).encode()


class PodNetwork:
    """The containers of `pods` on a network of their own, each idle until `start` runs its
    command; /etc/hosts of each names them all. `remove` removes them.

    Args:
        pods: the pods.
        workdir: a folder of this machine for their mounted files.
        workspace: a folder mounted read-only at /workspace in every pod (the training program).
    """

    def __init__(self, pods: List[PodSpec], workdir: str, workspace: str):
        self.prefix = f"hvdplus-k8s-{uuid.uuid4().hex[:6]}"
        self.network = self.prefix
        self.pods = {pod.name: pod for pod in pods}
        self._started: List[str] = []
        cluster.podman("network", "create", self.network)
        try:
            for pod in pods:
                mounts = self._write_files(pod, os.path.join(workdir, pod.name))
                cluster.podman("run", "-d", "--init", "--name", self.container(pod.name), "--hostname", pod.name,
                               "--network", self.network, "--user", str(pod.user), *mounts,
                               "-v", f"{workspace}:{WORKSPACE}:ro", "--entrypoint", "sleep", IMAGE, "infinity")
                self._started.append(pod.name)
            self.addresses = {name: cluster.podman(
                "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                self.container(name)).stdout.strip() for name in self._started}
            self.write_hosts(list(self.pods))
        except BaseException:
            self.remove()
            raise

    def container(self, pod_name: str) -> str:
        return f"{self.prefix}-{pod_name}"

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

    def write_hosts(self, names: List[str]) -> None:
        """Each of `names`' pods' DNS names and address in every container's /etc/hosts."""
        lines = "".join(f"{self.addresses[name]} {' '.join(self.pods[name].dns_names)}\n" for name in names)
        for name in self._started:
            cluster.podman("exec", "-u", "root", self.container(name), "sh", "-c",
                           f"printf '%s' '{lines}' >> /etc/hosts")

    def _exec_args(self, pod: PodSpec) -> List[str]:
        env = [word for key, value in pod.env.items() for word in ("-e", f"{key}={value}")]
        return ["-u", str(pod.user), "-w", "/home/hvd", *env, self.container(pod.name), *pod.command]

    def start_servers(self) -> None:
        """Run the command of every pod that serves (the agents), in the background."""
        for pod in self.pods.values():
            if pod.serves:
                cluster.podman("exec", "-d", *self._exec_args(pod))

    def wait_until_ready(self, port: int, timeout: float = 60) -> None:
        """Wait until every serving pod listens on `port`: their readiness probe."""
        deadline = time.monotonic() + timeout
        for pod in self.pods.values():
            while pod.serves:
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

    def remove(self):
        for name in self._started:
            cluster.podman("rm", "-f", "-t", "0", self.container(name), check=False)
        cluster.podman("network", "rm", "-f", self.network, check=False)
