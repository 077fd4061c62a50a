"""A cluster of podman containers on one machine, each a host with an ssh server, built
from the repository's Dockerfile: what tests/test_containers.py runs its jobs on.

The base image is made locally (no registry is reachable from the test machines):
`debootstrap --variant=minbase bookworm`, imported as localhost/debian:bookworm-slim, with
the machine's certificate bundle for pip (PIP_CERT), which the Dockerfile leaves alone.
"""

import glob
import os
import shutil
import subprocess
import tempfile
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_IMAGE = "localhost/debian:bookworm-slim"
IMAGE = "localhost/hvdplus:tests"
_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The torch CPU wheel for the image's Python (Debian bookworm's 3.11): the package index's
# default torch is a CUDA build of several GB.
_TORCH_WHEEL = "torch-2.13.0+cpu-cp311-*.whl"


def podman(*args, timeout=300, check=True):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=check)


def unavailable_reason():
    """Why containers cannot run here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed"
    if podman("info", check=False, timeout=60).returncode != 0:
        return "podman cannot run here"
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0 and shutil.which("debootstrap") is None:
        return f"no {BASE_IMAGE} image and no debootstrap to make one"
    return None


def ensure_base_image():
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="hvdplus-rootfs-") as root:
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", root], check=True,
                       capture_output=True, timeout=600)
        shutil.copy(_CA_BUNDLE, os.path.join(root, "etc/ssl/host-ca-bundle.crt"))
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["podman", "import", "--change", "ENV PIP_CERT=/etc/ssl/host-ca-bundle.crt", "-",
                        BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True, timeout=300)
        tar.wait()


def torch_wheel_folder():
    """A folder of this machine's wheels holding torch's CPU build for the image, or None."""
    for folder in os.environ.get("PIP_FIND_LINKS", "").split() + ["/opt/wheels"]:
        if glob.glob(os.path.join(folder, _TORCH_WHEEL)):
            return folder
    return None


def build_image() -> bool:
    """Builds IMAGE from the Dockerfile, with torch when a local wheel of it is found; True if with torch."""
    wheels = torch_wheel_folder()
    torch_args = [] if wheels is None else [
        "--volume", f"{wheels}:/opt/wheels:ro", "--build-arg", "PIP_FIND_LINKS=/opt/wheels",
        "--build-arg", "FRAMEWORKS=torch", "--build-arg", "TORCH_INDEX_URL=https://pypi.org/simple"]
    podman("build", "--format", "docker", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", *torch_args, "-t", IMAGE, REPO,
           timeout=900)
    return wheels is not None


class Cluster:
    """`hosts` containers named <prefix>-1.. on a network of their own, sharing a job key,
    with tests/containers at /jobs and each {folder: path} of `mounts`, read-only."""

    def __init__(self, hosts: int, workdir: str, mounts=None):
        self.prefix = f"hvdplus-{uuid.uuid4().hex[:6]}"
        self.network = self.prefix
        self.names = [f"{self.prefix}-{i + 1}" for i in range(hosts)]
        self.key = os.path.join(workdir, f"{self.prefix}_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key], check=True)
        volumes = []
        for folder, path in {f"{REPO}/tests/containers": "/jobs", **(mounts or {})}.items():
            volumes += ["-v", f"{folder}:{path}:ro"]
        podman("network", "create", self.network)
        try:
            for name in self.names:
                podman("run", "-d", "--name", name, "--hostname", name, "--network", self.network,
                       "-v", f"{self.key}:/run/hvdplus/job_key:ro", "-v", f"{self.key}.pub:/run/hvdplus/job_key.pub:ro",
                       *volumes, IMAGE, "sleep", "infinity")
        except BaseException:
            self.remove()
            raise

    def run(self, *command, timeout=120):
        """`command` as the user hvd in the first container; the CompletedProcess."""
        return podman("exec", "-u", "hvd", "-w", "/home/hvd", self.names[0], *command, timeout=timeout, check=False)

    def pid(self, name):
        """The process id, on this machine, of container `name`'s first process (its namespaces')."""
        return podman("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()

    def hosts(self, slots):
        """-H for `slots` ranks on each container, in order."""
        return ",".join(f"{name}:{count}" for name, count in zip(self.names, slots))

    def remove(self):
        for name in self.names:
            podman("rm", "-f", "-t", "0", name, check=False)
        podman("network", "rm", "-f", self.network, check=False)
