"""Jobs across podman containers on one machine: real hosts, started over ssh, talking over
a network of their own (tests/containers/cluster.py builds them from the Dockerfile).

Skipped where podman (or a way to make the base image) is absent. Every container and the
network are removed at the end, whatever happens."""

import json
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "containers"))

import cluster  # noqa: E402 (found through the path added above)

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(900)]

REASON = cluster.unavailable_reason()
if REASON:
    pytestmark.append(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="module")
def image():
    """Whether the image has torch (it does where this machine has a torch CPU wheel)."""
    cluster.ensure_base_image()
    return cluster.build_image()


@pytest.fixture
def hosts(image, tmp_path):
    made = []

    def make(count):
        made.append(cluster.Cluster(count, str(tmp_path)))
        return made[-1]

    yield make
    for each in made:
        each.remove()


def run_check(nodes, slots):
    result = nodes.run("hvdplusrun", "-np", str(sum(slots)), "-H", nodes.hosts(slots),
                       "python", "/jobs/check_job.py", json.dumps(slots))
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    for rank in range(sum(slots)):
        assert f"checked {rank} on " in result.stdout, output
    return result


@pytest.mark.parametrize("slots", [[2, 2], [1, 1, 1, 1], [1, 2, 1]], ids=["2x2", "4x1", "1+2+1"])
def test_every_collective_across_containers(hosts, slots):
    result = run_check(hosts(len(slots)), slots)
    # Each rank's lines are tagged with its rank, and ran on the host the slots put it on.
    assert f"checked {sum(slots) - 1} on " in result.stdout


def test_distributed_optimizer_across_containers_trains_like_one_process(hosts, image):
    if not image:
        pytest.skip("no local torch CPU wheel to put in the image (PIP_FIND_LINKS or /opt/wheels)")
    nodes = hosts(2)
    result = nodes.run("hvdplusrun", "-np", "4", "-H", nodes.hosts([2, 2]), "python", "/jobs/torch_job.py",
                       timeout=300)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    for rank, host in enumerate(nodes.names[:1] * 2 + nodes.names[1:] * 2):
        assert f"trained {rank} on {host}" in result.stdout, output


def test_an_unreachable_host_is_named_within_seconds(hosts):
    nodes = hosts(1)
    started = time.monotonic()
    result = nodes.run("hvdplusrun", "-np", "2", "-H", f"{nodes.names[0]}:1,no-such-host:1", "true", timeout=60)
    assert result.returncode != 0
    assert "no-such-host" in result.stdout + result.stderr
    assert time.monotonic() - started < 30


def test_a_container_killed_mid_job_ends_the_job_with_an_error(hosts):
    nodes = hosts(2)
    job = cluster.subprocess.Popen(
        ["podman", "exec", "-u", "hvd", nodes.names[0], "hvdplusrun", "-np", "2", "-H", nodes.hosts([1, 1]),
         "python", "-c", "import time, hvdplus as hvd, numpy as np\n"
         "hvd.init()\n"
         "hvd.allreduce(np.ones(4), name='first')\n"
         "print('running', flush=True)\n"
         "while True:\n"
         "    hvd.allreduce(np.ones(4), name='tick')\n"
         "    time.sleep(0.05)\n"],
        stdout=cluster.subprocess.PIPE, stderr=cluster.subprocess.STDOUT, text=True)
    try:
        lines = []
        while not any("running" in line for line in lines):  # every rank is in the loop
            line = job.stdout.readline()
            assert line, "the job ended before it ran:\n" + "".join(lines)
            lines.append(line)
        cluster.podman("kill", nodes.names[1])
        killed = time.monotonic()
        rest, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0, "".join(lines) + rest
    assert time.monotonic() - killed < 30
