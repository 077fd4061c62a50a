"""A cluster of podman containers on one machine, each a host with an ssh server, built
from the repository's Dockerfile: what tests/test_containers.py runs its jobs on.

The base image is made locally from Debian's packages alone (no image registry is
reachable from the test machines): `debootstrap --variant=minbase bookworm`, imported as
localhost/debian:bookworm-slim. The certificate bundle that this machine's pip trusts goes
into it (PIP_CERT), so pip in the image reaches the package index through the same proxy,
if any. torch's CPU build reaches the image as a wheel that `pip download` puts into a
folder of the build's own.
"""

import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_IMAGE = "localhost/debian:bookworm-slim"
IMAGE = "localhost/hvdplus:tests"
# The torch CPU build for the image's Python (Debian bookworm's 3.11): the package index's
# default torch is a CUDA build of several GB.
TORCH_REQUIREMENT = "torch==2.13.0"
IMAGE_PYTHON = "3.11"


def podman(*args, timeout=300, check=True):
    """Run podman; with `check`, a failure raises with what podman said."""
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... exited {result.returncode}:\n"
                           f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def unavailable_reason():
    """Why containers cannot run here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (tests/containers/prepare_host.sh installs it)"
    if podman("info", check=False, timeout=60).returncode != 0:
        return "podman cannot run here"
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0 and shutil.which("debootstrap") is None:
        return f"no {BASE_IMAGE} image and no debootstrap to make one"
    return None


def container_test_marks():
    """The marks of a module whose tests run in containers: slow, with a timeout, and skipped
    with the reason where containers cannot run here (which fails a CI run)."""
    marks = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(900)]
    reason = unavailable_reason()
    return marks + [pytest.mark.skip(reason=reason)] if reason else marks


def pip_certificate_bundle():
    """The certificate bundle this machine's pip trusts: PIP_CERT, pip's `cert` setting, or
    the system's."""
    named = os.environ.get("PIP_CERT") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True, text=True).stdout.strip()
    for bundle in (named, "/etc/ssl/certs/ca-certificates.crt"):
        if bundle and os.path.isfile(bundle):
            return bundle
    raise FileNotFoundError("no certificate bundle for pip in the image: set PIP_CERT or install ca-certificates")


def ensure_base_image():
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="hvdplus-rootfs-") as root:
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", root], check=True,
                       capture_output=True, timeout=900)
        # minbase makes no /etc/ssl: the Dockerfile's ca-certificates fills it later.
        os.makedirs(os.path.join(root, "etc/ssl"), exist_ok=True)
        shutil.copy(pip_certificate_bundle(), os.path.join(root, "etc/ssl/host-ca-bundle.crt"))
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["podman", "import", "--change", "ENV PIP_CERT=/etc/ssl/host-ca-bundle.crt", "-",
                        BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True, timeout=300)
        tar.wait()


def download_torch_wheel(folder):
    """Put torch's wheel for the image's Python into `folder` with this machine's pip, which
    takes the CPU build where its find-links or index offer one; fail unless it is one."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", IMAGE_PYTHON, "--platform", "manylinux_2_28_x86_64", "--dest", folder,
                    TORCH_REQUIREMENT], check=True, capture_output=True, timeout=1800)
    wheels = glob.glob(os.path.join(folder, "torch-*.whl"))
    if not any("+cpu" in os.path.basename(wheel) for wheel in wheels):
        raise RuntimeError(f"pip download gave {wheels}, not torch's CPU build: name PyTorch's CPU wheel index in "
                           "PIP_EXTRA_INDEX_URL, or a folder holding the CPU wheel in PIP_FIND_LINKS")


@functools.lru_cache(maxsize=None)
def build_image():
    """Build IMAGE from the Dockerfile, with torch's CPU build, over the base image (made first
    where it is missing). Once a process: the Kubernetes and Slurm images are built over it, and
    even podman's cached build takes seconds (torch's wheel is fetched again). A build that
    failed is tried again by the next call."""
    ensure_base_image()
    with tempfile.TemporaryDirectory(prefix="hvdplus-wheels-") as wheels:
        download_torch_wheel(wheels)
        podman("build", "--format", "docker", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
               "--volume", f"{wheels}:/opt/wheels:ro", "--build-arg", "PIP_FIND_LINKS=/opt/wheels",
               "--build-arg", "FRAMEWORKS=torch", "-t", IMAGE, REPO, timeout=1800)


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
            self._write_hosts_files()
        except BaseException:
            self.remove()
            raise

    def _write_hosts_files(self):
        """Every container's name and address in each container's /etc/hosts. Names then resolve
        without the network's DNS server, which fails lookups for a moment while it reloads after
        a container is killed: a restart that lands in that moment would leave out a live host."""
        addresses = {name: podman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                  name).stdout.strip() for name in self.names}
        lines = "".join(f"{address} {name}\n" for name, address in addresses.items())
        for name in self.names:
            podman("exec", "-u", "root", name, "sh", "-c", f"printf '%s' '{lines}' >> /etc/hosts")

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
