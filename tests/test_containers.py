"""Jobs across podman containers on one machine: real hosts, started over ssh, talking over
a network of their own (tests/testkit/cluster.py builds them from the Dockerfile).

Skipped where podman (or a way to make the base image) is absent, which fails a CI run
(tests/conftest.py). Every container and the network are removed at the end, whatever happens."""

import json
import os
import time

import pytest

from elastic_jobs import replay  # the numpy replay of tests/test_elastic.py
from testkit import cluster, preparations, timing

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(900)]

REASON = cluster.unavailable_reason()
if REASON:
    pytestmark.append(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="module")
def container_image(run_folder):
    """The image every container runs: the Dockerfile's, with torch's CPU build (built in the
    background from the session's start: testkit/preparations.py)."""
    preparations.result("container_image", run_folder)
    return cluster.IMAGE


@pytest.fixture
def hosts(container_image, tmp_path):
    made = []

    def make(count, mounts=None):
        made.append(cluster.Cluster(count, str(tmp_path), mounts))
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


def test_distributed_optimizer_across_containers_trains_like_one_process(hosts):
    nodes = hosts(2)
    result = nodes.run("hvdplusrun", "-np", "4", "-H", nodes.hosts([2, 2]), "python", "/jobs/torch_job.py",
                       timeout=300)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    for rank, host in enumerate(nodes.names[:1] * 2 + nodes.names[1:] * 2):
        assert f"trained {rank} on {host}" in result.stdout, output


def test_a_200_mb_argument_and_results_cross_containers_that_share_no_files(hosts):
    nodes = hosts(3)
    # Rank 0 on the second container: the argument leaves the caller's (the first) over the network.
    order = nodes.names[1:] + nodes.names[:1]
    result = nodes.run("python", "/jobs/large_payload_job.py", "3", "200", ",".join(f"{name}:1" for name in order),
                       timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["hosts"] == order


def test_an_elastic_job_across_containers_goes_on_without_a_dead_rank(hosts):
    nodes = hosts(3, mounts={os.path.join(cluster.REPO, "tests", "elastic_jobs"): "/elastic"})
    # The rank on the third container kills itself at step 5; the two others re-form the job
    # in place (ULFM) across their containers and finish the epochs.
    result = nodes.run("hvdplusrun", "-np", "3", "--min-np", "2", "-H", nodes.hosts([1, 1, 1]), "python",
                       "/elastic/torch_train.py", "/home/hvd/out.json", "--kill", "2:5:step", timeout=300)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    trained = json.loads(cluster.podman("exec", nodes.names[0], "cat", "/home/hvd/out.json").stdout)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    assert replay.sizes(trained)[:5] == [3] * 5 and set(replay.sizes(trained)[5:]) == {2}, replay.sizes(trained)


def test_an_elastic_job_resumes_from_its_last_commit_without_rank_0s_container(hosts):
    nodes = hosts(3, mounts={os.path.join(cluster.REPO, "tests", "elastic_jobs"): "/elastic"})
    # The launcher runs in the second container; rank 0 in the first, which is killed once it
    # has passed step 3 (it writes a file there at step 3). Open MPI ends every rank when it loses
    # a host's daemon, ULFM or not: hvdplusrun restarts the job on the two containers left, and
    # it resumes from the newest commit that their own disks hold. No folder is shared.
    job = cluster.subprocess.Popen(
        ["podman", "exec", "-u", "hvd", "-w", "/home/hvd", nodes.names[1], "hvdplusrun", "-np", "3", "--min-np", "2",
         "-H", nodes.hosts([1, 1, 1]), "python", "/elastic/torch_train.py", "/home/hvd/out.json",
         "--step-seconds", "0.5", "--grow", "/home/hvd/at_step_3:3:1"],
        stdout=cluster.subprocess.PIPE, stderr=cluster.subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while cluster.podman("exec", nodes.names[0], "test", "-f", "/home/hvd/at_step_3", check=False).returncode:
            if job.poll() is not None:
                raise AssertionError("the job ended before step 3:\n" + job.stdout.read()[-6000:])
            assert time.monotonic() < deadline, "the job never reached step 3"
            time.sleep(0.5)
        cluster.podman("kill", nodes.names[0])
        try:
            output, _ = job.communicate(timeout=240)
        except cluster.subprocess.TimeoutExpired:
            job.kill()
            raise AssertionError("the job did not end within 240 s of the kill:\n" + job.communicate()[0][-8000:])
    finally:
        job.kill()
    assert job.returncode == 0, output[-6000:]
    assert f"hosts ['{nodes.names[0]}'] are left out" in output, output[-6000:]
    # Rank 0 of the restarted job, on the second container, wrote the result.
    trained = json.loads(cluster.podman("exec", nodes.names[1], "cat", "/home/hvd/out.json").stdout)
    replay.check_every_sample_once(trained)
    replay.check_weights(trained)
    sizes = replay.sizes(trained)
    before = sizes.count(3)
    assert before >= 3 and sizes == [3] * before + [2] * (len(sizes) - before), sizes


def test_an_unreachable_host_is_named_within_seconds(hosts):
    nodes = hosts(1)
    started = time.monotonic()
    result = nodes.run("hvdplusrun", "-np", "2", "-H", f"{nodes.names[0]}:1,no-such-host:1", "true", timeout=60)
    assert result.returncode != 0
    assert "no-such-host" in result.stdout + result.stderr
    timing.assert_took_under(time.monotonic() - started, 30, quiet=10.4, what="an unreachable host being named")


def test_a_container_killed_mid_job_ends_the_job_with_an_error(hosts):
    nodes = hosts(2)
    job = cluster.subprocess.Popen(
        ["podman", "exec", "-u", "hvd", nodes.names[0], "hvdplusrun", "-np", "2", "-H", nodes.hosts([1, 1]),
         "python", "/jobs/allreduce_until_killed.py"],
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
    timing.assert_took_under(time.monotonic() - killed, 30, quiet=0.2, what="the job ending after a host was killed")
