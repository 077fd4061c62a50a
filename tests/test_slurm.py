"""Jobs on a real Slurm (Debian's 22.05) whose controller and three compute nodes are podman
containers, each a host, with no ssh client or server in any (tests/testkit/slurm_cluster.py
builds and removes them), sharing one folder at /shared as a cluster's shared file system.

The batch scripts are those of examples/slurm/, as a user would submit them."""

import datetime
import json
import os
import re
import threading
import time

import numpy as np
import pytest

from hvdplus.runner.slurm_allocation import expand_host_list
from testkit import cluster, preparations, slurm_cluster, timing
from testkit.training_logs import final_result, read_step_log

pytestmark = cluster.container_test_marks()

SHARED = slurm_cluster.SHARED


@pytest.fixture(scope="module")
def slurm_image(run_folder):
    """Built in the background from the session's start (testkit/preparations.py)."""
    preparations.result("slurm_image", run_folder)


@pytest.fixture(scope="module")
def slurm(slurm_image, tmp_path_factory):
    """The module's cluster. The jobs that take a minute or more start with it and run beside
    the other tests (LongJobs): one that trains past its time limit, one preempted, one
    requeued, and, on a second cluster of its own, an elastic job that loses a node."""
    with slurm_cluster.SlurmCluster(3, str(tmp_path_factory.mktemp("slurm")), shared=True) as made, \
            slurm_cluster.SlurmCluster(3, str(tmp_path_factory.mktemp("slurm-lost-node")), shared=True) as lost_node:
        made.long_jobs = LongJobs(made, lost_node)
        try:
            yield made
        finally:
            made.long_jobs.stop()


def rank_lines(output):
    """The JSON lines of tests/containers/hvdplus_ranks.py, whatever tags precede them."""
    return [json.loads(match) for match in re.findall(r"(\{\"rank\".*\})", output)]


def check_ranks(ranks, hosts, output):
    expected = sum(np.arange(4.0) * (rank + 1) for rank in range(len(hosts)))
    assert sorted(rank["rank"] for rank in ranks) == list(range(len(hosts))), output
    assert sorted(rank["host"] for rank in ranks) == sorted(hosts), output
    for rank in ranks:
        assert rank["size"] == len(hosts) and rank["local_size"] == 1 and rank["local_rank"] == 0, output
        np.testing.assert_array_equal(rank["sum"], expected)


def test_hvdplusrun_in_a_batch_job_takes_its_hosts_and_slots_from_the_allocation_without_ssh(slurm):
    for host in [slurm.controller, *slurm.nodes]:
        assert slurm.run("sh", "-c", "command -v ssh sshd", host=host).returncode != 0, f"{host} has ssh"
    script = slurm_cluster.batch_script("hvdplusrun.sbatch", PROGRAM="/jobs/hvdplus_ranks.py", FLAGS="--verbose")
    # --check-build says what it found; more ranks than the allocation has fail at once, saying so.
    before = 'hvdplusrun --check-build\nhvdplusrun -np 4 true; echo "too many: $?"\n'
    script = script.replace("exec hvdplusrun", before + "exec hvdplusrun")
    job = slurm.submit(script, "--nodes=3", "--ntasks-per-node=1")
    fields = slurm.wait_for_job(job, timeout=120)
    output = slurm.output(job)
    assert fields["JobState"] == "COMPLETED", f"{fields['JobState']}, exit code {fields['ExitCode']}:\n{output}"
    assert "-np 4 is more than the 3 slots of the Slurm allocation" in output and "too many: 2" in output, output
    assert f"hvdplusrun: Slurm allocation of job {job}: " in output and "SLURM_TASKS_PER_NODE=1(x3)" in output, output
    assert f"[X] Slurm allocation of job {job}: {','.join(f'{node}:1' for node in slurm.nodes)}" in output, output
    check_ranks(rank_lines(output), slurm.nodes, output)


def test_srun_with_pmix_makes_each_task_a_rank_and_refuses_to_start_without_it(slurm):
    shown = slurm.run("srun", "--nodes=3", "--mpi=pmix", "python", "/jobs/hvdplus_ranks.py", timeout=120)
    ranks = rank_lines(shown.stdout)
    check_ranks(ranks, slurm.nodes, shown.stdout + shown.stderr)
    assert all(rank["procid"] == str(rank["rank"]) for rank in ranks), shown.stdout
    assert "help file" not in shown.stderr, shown.stderr  # PMIx's warning about its components
    trained = slurm.run("srun", "--nodes=3", "--mpi=pmix", "python", "/jobs/torch_job.py", timeout=180)
    # torch_job.py holds each rank's weights to one process training on the whole batch.
    assert trained.returncode == 0, trained.stdout + trained.stderr
    # torch_job.py imports hvdplus.torch, which starts MPI before hvd.init(): the import set PMIx's settings.
    assert "help file" not in trained.stderr, trained.stderr
    assert sorted(re.findall(r"trained (\d) on (\S+)", trained.stdout)) == [
        (str(rank), host) for rank, host in enumerate(slurm.nodes)], trained.stdout
    started = time.monotonic()
    refused = slurm.run("srun", "--nodes=3", "--mpi=none", "python", "/jobs/hvdplus_ranks.py", timeout=60)
    assert refused.returncode != 0 and rank_lines(refused.stdout) == [], refused.stdout
    assert "srun started it without a PMI server" in refused.stderr and "libpmix-dev" in refused.stderr, refused.stderr
    timing.assert_took_under(time.monotonic() - started, 30, quiet=1.1, what="srun --mpi=none being refused")


def test_hvdplus_run_under_salloc_returns_the_ranks_values_in_order(slurm):
    result = slurm.run("salloc", "--nodes=2", "python", "/jobs/run_function_in_allocation.py", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    values = json.loads(re.search(r"^(\[.*\])$", result.stdout, flags=re.M).group(1))
    total = [sum(value * 2.0 * (rank + 1) for rank in range(2)) for value in range(3)]
    # Any two nodes: one may still be completing a long job's requeue. Ranks follow the allocation's order.
    hosts = expand_host_list(re.search(r"^allocation (\S+)$", result.stdout, flags=re.M).group(1))
    assert len(hosts) == 2 and set(hosts) <= set(slurm.nodes), result.stdout
    assert values == [[rank, 2, host, total] for rank, host in enumerate(hosts)], result.stdout


def test_a_rank_that_raises_fails_the_job_within_seconds_naming_the_rank_and_its_host(slurm):
    folder = slurm.shared / "raises"
    folder.mkdir()
    os.chmod(folder, 0o777)
    job = slurm.submit(slurm_cluster.batch_script("hvdplusrun.sbatch", PROGRAM="/jobs/resumable_training.py",
                               ARGUMENTS=f"--steps 30 --step-seconds 0.2 --log-dir {SHARED}/raises/logs "
                                         "--raise-at-step 3 --raise-rank 1"),
                       "--nodes=2", "--ntasks-per-node=1", f"--output={SHARED}/raises/output")
    fields = slurm.wait_for_job(job, timeout=120)
    output = (folder / "output").read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "1:0", f"{fields}\n{output}"
    assert f"rank 1 on host {slurm.nodes[1]}: ValueError: rank 1 refuses step 3" in output, output
    raised = max(float(line.split()[1]) for path in (folder / "logs").iterdir()
                 for line in path.read_text().splitlines() if line.startswith("raising"))
    ended = datetime.datetime.fromisoformat(fields["EndTime"]).timestamp()  # whole seconds, the cluster's time zone
    assert ended - raised < 5 + 1, f"the job ended {ended - raised:.1f} s after rank 1 raised"


class Training:
    """One run of tests/containers/resumable_training.py as a Slurm job, with its logs and
    commits in a folder of its own under /shared."""

    def __init__(self, slurm, name, script, *sbatch_args):
        self.slurm, self.name = slurm, name
        self.folder = slurm.shared / name
        self.folder.mkdir()
        os.chmod(self.folder, 0o777)
        self.job = slurm.submit(script, f"--output={SHARED}/{name}/output", "--open-mode=append", *sbatch_args)
        self._requeue_seen = {}  # restart count: when the job was first seen requeued that many times

    def ready(self):
        return (self.folder / "ready").exists()

    def fields(self):
        return self.slurm.job(self.job)

    def release_if_requeued(self, fields):
        """Start a requeued job without Slurm's wait, as a user who wants the resumed job at once would.

        Slurm holds a requeued batch job for about two minutes (its BeginTime). Its owner may start
        it at once, but not within the second of the requeue: slurmd refuses a launch whose
        credential is not newer, in whole seconds, than the requeue's revocation of the old one,
        and slurmctld then ends the job FAILED 1:0 ("Killing non-startable batch JobId=...: Job
        credential revoked"). So the job is started once a whole second has passed since it was
        first seen requeued."""
        restarts = int(fields.get("Restarts", "0"))
        if fields["JobState"] != "PENDING" or restarts == 0:
            return
        seen = self._requeue_seen.setdefault(restarts, time.time())
        if time.time() >= seen + 1.0:
            self.slurm.run("scontrol", "update", f"JobId={self.job}", "StartTime=now")

    def output(self):
        return (self.folder / "output").read_text()

    def check_nothing_lost(self, steps, requeues_at_least):
        fields, output = self.fields(), self.output()
        what = f"{self.name} (job {self.job}): {fields['JobState']}, exit code {fields['ExitCode']}\n{output[-6000:]}"
        assert fields["JobState"] == "COMPLETED", f"{what}\n{self.slurm.logs()}"
        assert int(fields["Restarts"]) >= requeues_at_least, what
        assert output.count("asked the job to stop; every rank stopped at commit") >= requeues_at_least, what
        log = read_step_log(self.folder / "logs")
        log.check_complete(steps)
        assert log.repeated() == [], f"{self.name}: steps that ran twice: {log.repeated()}"
        assert set(log.sizes()) == {3}, what
        result = final_result(output)
        assert result["steps"] == steps, what
        np.testing.assert_allclose(result["weights"], log.replayed_weights(), rtol=1e-12)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class LongJobs(threading.Thread):
    """The module's long jobs, each started as the cluster is, and a thread beside the tests
    that acts for each: it starts requeued jobs at once (release_if_requeued), and does what a
    job waits for once it is ready (a preemption, a requeue, a node killed).

    - `limited` trains past its one-minute time limit, warned by `--signal=B:USR1@40`;
    - `preempted` gets `scancel --signal=USR1 --batch` while it runs;
    - `requeued`, started with `srun --mpi=pmix`, gets `scontrol requeue` (whose SIGTERM reaches
      the ranks, which srun started themselves);
    - `elastic`, on `lost_node`'s cluster under `--no-kill`, loses its third node.
    """

    def __init__(self, slurm, lost_node):
        super().__init__(name="slurm-long-jobs", daemon=True)
        self.limited = Training(slurm, "time-limit", slurm_cluster.batch_script(
            "hvdplusrun.sbatch", COMMIT_DIR=f"{SHARED}/time-limit/commits", PROGRAM="/jobs/resumable_training.py",
            ARGUMENTS=f"--steps 64 --step-seconds 1 --log-dir {SHARED}/time-limit/logs"),
            "--nodes=3", "--ntasks-per-node=1", "--time=1", "--signal=B:USR1@40")
        self.preempted = Training(slurm, "preempted", slurm_cluster.batch_script(
            "hvdplusrun.sbatch", COMMIT_DIR=f"{SHARED}/preempted/commits", PROGRAM="/jobs/resumable_training.py",
            ARGUMENTS=f"--steps 30 --step-seconds 0.5 --log-dir {SHARED}/preempted/logs "
                      f"--ready-file {SHARED}/preempted/ready"),
            "--nodes=3", "--ntasks-per-node=1")
        self.requeued = Training(slurm, "requeued", slurm_cluster.batch_script(
            "srun.sbatch", COMMIT_DIR=f"{SHARED}/requeued/commits", PROGRAM="/jobs/resumable_training.py",
            ARGUMENTS=f"--steps 30 --step-seconds 0.5 --log-dir {SHARED}/requeued/logs "
                      f"--ready-file {SHARED}/requeued/ready"),
            "--nodes=3", "--ntasks-per-node=1")
        self.elastic = Training(lost_node, "elastic", slurm_cluster.batch_script(
            "elastic.sbatch", COMMIT_DIR=f"{SHARED}/elastic/commits", PROGRAM="/jobs/resumable_training.py",
            ARGUMENTS=f"--steps 20 --step-seconds 0.4 --log-dir {SHARED}/elastic/logs "
                      f"--ready-file {SHARED}/elastic/ready"),
            "--nodes=3", "--ntasks-per-node=1")
        self.when_ready = {
            "preempted": lambda: slurm.run("scancel", "--signal=USR1", "--batch", self.preempted.job),
            "requeued": lambda: slurm.run("scontrol", "requeue", self.requeued.job),
            # Not the batch host, where hvdplusrun runs.
            "elastic": lambda: (time.sleep(1), lost_node.kill(lost_node.nodes[2])),
        }
        self.states = {}
        self.error = None
        self._stopping = threading.Event()
        self.start()

    def trainings(self):
        return [self.limited, self.preempted, self.requeued, self.elastic]

    def run(self):
        try:
            while not self._stopping.is_set():
                for training in self.trainings():
                    fields = training.fields()
                    self.states[training.name] = fields["JobState"]
                    training.release_if_requeued(fields)
                    act = self.when_ready.get(training.name)
                    if act is not None and training.ready():
                        del self.when_ready[training.name]
                        act()
                if all(state in ENDED for state in self.states.values()):
                    return
                time.sleep(1)
        except Exception as error:  # noqa: BLE001 - raised in the test that waits
            self.error = error

    def wait(self, *trainings, timeout=400):
        """Wait until `trainings` have ended."""
        deadline = time.monotonic() + timeout
        while not all(self.states.get(training.name) in ENDED for training in trainings):
            if self.error is not None:
                raise self.error
            assert self.is_alive(), f"the jobs' thread ended: {self.states}"
            assert time.monotonic() < deadline, f"{self.states}\n{self.limited.slurm.logs()}"
            time.sleep(1)

    def stop(self):
        self._stopping.set()
        self.join(10)


def test_a_time_limit_or_a_preemption_loses_no_step(slurm):
    """Each job commits on the signal, requeues itself and resumes from its commit in /shared."""
    jobs = slurm.long_jobs
    jobs.wait(jobs.limited, jobs.preempted, jobs.requeued)
    jobs.limited.check_nothing_lost(64, requeues_at_least=1)
    jobs.preempted.check_nothing_lost(30, requeues_at_least=1)
    jobs.requeued.check_nothing_lost(30, requeues_at_least=1)


def test_an_elastic_job_under_no_kill_goes_on_without_a_lost_node(slurm):
    jobs = slurm.long_jobs
    jobs.wait(jobs.elastic)
    training = jobs.elastic
    fields, output = training.fields(), training.output()
    assert "elastic" not in jobs.when_ready, f"the node was never killed: {fields}\n{output}"
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", f"{fields}\n{output}"
    log = read_step_log(training.folder / "logs")
    log.check_complete(20)
    assert len(log.repeated()) <= 1, f"steps that ran twice: {log.repeated()}"  # one commit interval
    assert log.sizes()[0] == 3 and log.sizes()[-1] == 2, log.sizes()
    result = final_result(output)
    assert result["steps"] == 20, output
    np.testing.assert_allclose(result["weights"], log.replayed_weights(), rtol=1e-12)
