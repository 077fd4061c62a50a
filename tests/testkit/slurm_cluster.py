"""A Slurm cluster of podman containers on one machine: one controller (slurmctld) and
compute nodes (slurmd), each a host named like its container, on a network of their own,
sharing one munge key. What tests/test_slurm.py runs its jobs on.

The image is the hvdplus test image (tests/testkit/cluster.py builds it) with Debian's Slurm
added and ssh removed (tests/containers/slurm/Containerfile), so a job's processes can only
start through Slurm. Every container and the network are removed at the end, whatever happens.
"""

import os
import pathlib
import re
import shlex
import subprocess
import time
import uuid

from hvdplus.common.slurm_jobs import parse_fields
from testkit import cluster

__all__ = ["IMAGE", "SlurmCluster", "batch_script", "build_image"]

IMAGE = "localhost/hvdplus:slurm"
CONTAINER_FILES = os.path.join(cluster.REPO, "tests", "containers", "slurm")
EXAMPLES = os.path.join(cluster.REPO, "examples", "slurm")
# Where the job scripts and programs of tests/containers appear in every container.
JOBS = "/jobs"
# Where the folder that every node shares appears (a cluster's shared file system).
SHARED = "/shared"
# CPUs each node declares to Slurm (slurm.conf's config_overrides lets it differ from the machine's):
# enough for the tests' jobs of one task per node to run side by side rather than queue.
NODE_CPUS = 8


def build_image():
    """Build IMAGE, and first the images it is built on (podman's cache keeps each step that
    has not changed)."""
    cluster.build_image()
    cluster.podman("build", "--format", "docker", "--build-arg", f"BASE_IMAGE={cluster.IMAGE}",
                   "-f", os.path.join(CONTAINER_FILES, "Containerfile"), "-t", IMAGE, CONTAINER_FILES, timeout=1800)


def batch_script(example, **settings):
    """The text of examples/slurm/<example> with its `NAME=...` line for each of `settings` set
    to that value (quoted for the shell), as a user edits the script before submitting it."""
    with open(os.path.join(EXAMPLES, example)) as handle:
        text = handle.read()
    for name, value in settings.items():
        text, found = re.subn(rf"^{name}=.*$", lambda _: f"{name}={shlex.quote(str(value))}", text, flags=re.M)
        if found != 1:
            raise ValueError(f"examples/slurm/{example} has no line {name}=...")
    return text


class SlurmCluster:
    """A controller <prefix>-ctl and `nodes` compute nodes <prefix>-node1.. with
    tests/containers at /jobs, read-only; usable as a context manager that removes it all.

    Args:
        nodes: how many compute nodes (slurmd containers).
        workdir: a folder of this machine for the cluster's slurm.conf and munge key.
        start_timeout: seconds to wait for every node to be idle.
        mounts: {folder of this machine: (path in every container, "ro" or "rw")}.
        shared: also give every node a folder at SHARED, which the user hvd may write: `workdir`'s
            `shared` folder, as `self.shared` (a pathlib.Path).
    """

    def __init__(self, nodes: int, workdir: str, start_timeout: float = 120, mounts=None, shared=False):
        self.prefix = f"hvdplus-slurm-{uuid.uuid4().hex[:6]}"
        self.shared = None
        if shared:
            self.shared = pathlib.Path(workdir) / "shared"
            self.shared.mkdir()
            os.chmod(self.shared, 0o777)  # the user hvd in the containers writes there
            mounts = {**(mounts or {}), str(self.shared): (SHARED, "rw")}
        self.network = self.prefix
        self.controller = f"{self.prefix}-ctl"
        self.nodes = [f"{self.prefix}-node{i + 1}" for i in range(nodes)]
        self._started = []
        config, key = self._write_config(workdir)
        volumes = [f"{config}:/etc/slurm/slurm.conf:ro", f"{key}:/run/hvdplus-slurm/munge.key:ro",
                   f"{cluster.REPO}/tests/containers:{JOBS}:ro"]
        volumes += [f"{folder}:{path}:{mode}" for folder, (path, mode) in (mounts or {}).items()]
        cluster.podman("network", "create", self.network)
        try:
            for name in [self.controller, *self.nodes]:
                cluster.podman("run", "-d", "--name", name, "--hostname", name, "--network", self.network,
                               *[word for volume in volumes for word in ("-v", volume)], IMAGE)
                self._started.append(name)
            self._write_hosts_files()
            cluster.podman("exec", self.controller, "hvdplus-slurm-start", "controller")
            for name in self.nodes:
                cluster.podman("exec", name, "hvdplus-slurm-start", "node")
            self.wait_for_idle_nodes(len(self.nodes), start_timeout)
        except BaseException:
            self.remove()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.remove()

    def _write_config(self, workdir):
        """This cluster's slurm.conf and munge key in `workdir`; their paths."""
        with open(os.path.join(CONTAINER_FILES, "slurm.conf.template")) as template:
            text = template.read().format(controller=self.controller, nodes=",".join(self.nodes), cpus=NODE_CPUS)
        config = os.path.join(workdir, f"{self.prefix}-slurm.conf")
        with open(config, "w") as out:
            out.write(text)
        key = os.path.join(workdir, f"{self.prefix}-munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(os.urandom(1024))
        return config, key

    def _write_hosts_files(self):
        """Every container's name and address in each one's /etc/hosts: Slurm resolves node
        names as it goes, and the network's DNS server fails lookups for a moment after a
        container is killed."""
        addresses = {name: cluster.podman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                          name).stdout.strip() for name in self._started}
        lines = "".join(f"{address} {name}\n" for name, address in addresses.items())
        for name in self._started:
            cluster.podman("exec", name, "sh", "-c", f"printf '%s' '{lines}' >> /etc/hosts")

    def run(self, *command, host=None, user="hvd", input=None, timeout=120):
        """`command` as `user` in `host` (the controller unless named), from the user's home;
        the CompletedProcess."""
        workdir = "/root" if user == "root" else f"/home/{user}"
        interactive = ["-i"] if input is not None else []
        return subprocess.run(["podman", "exec", *interactive, "-u", user, "-w", workdir, host or self.controller,
                               *command], input=input, capture_output=True, text=True, timeout=timeout)

    def submit(self, script, *sbatch_args, user="hvd"):
        """Submit the batch `script` (its text) with `sbatch_args` from the controller; the job id."""
        result = self.run("sbatch", "--parsable", *sbatch_args, user=user, input=script)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(sbatch_args)} exited {result.returncode}:\n{result.stderr}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id):
        """The fields of `scontrol show job` for `job_id` (JobState, NodeList, BatchHost,
        StdOut, Restarts...)."""
        result = self.run("scontrol", "show", "job", "-o", str(job_id))
        if result.returncode != 0:
            raise RuntimeError(f"scontrol show job {job_id} exited {result.returncode}: {result.stderr}")
        return parse_fields(result.stdout)

    def wait_for_job(self, job_id, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                            "OUT_OF_MEMORY"), timeout=300):
        """Wait until job `job_id` is in one of `states` (by default, any end); its fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not in {states} within {timeout} s: {fields}\n{self.logs()}")
            time.sleep(0.5)

    def output(self, job_id):
        """What job `job_id`'s batch script wrote to its output file, read on its batch host
        (the nodes share no folder)."""
        fields = self.job(job_id)
        return cluster.podman("exec", fields["BatchHost"], "cat", fields["StdOut"], check=False).stdout

    def wait_for_idle_nodes(self, count, timeout):
        """Wait until `count` nodes are idle."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.run("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split()[1::2]
            if states.count("idle") >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} idle Slurm nodes not within {timeout} s: {states}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self):
        """The ends of the daemons' logs, for a failure's message."""
        parts = []
        for name in self._started:
            log = "slurmctld.log" if name == self.controller else "slurmd.log"
            text = cluster.podman("exec", name, "tail", "-n", "30", f"/var/log/slurm/{log}", check=False).stdout
            parts.append(f"--- {name} {log}\n{text}")
        return "".join(parts)

    def kill(self, node):
        """Kill container `node` at once, as a crashed host."""
        cluster.podman("kill", node)

    def remove(self):
        for name in self._started:
            cluster.podman("rm", "-f", "-t", "0", name, check=False)
        cluster.podman("network", "rm", "-f", self.network, check=False)
