"""Rank 0's stall inspector on a coordinator with a hand-driven clock: when it reports, what a
report says, and when a stall ends the job's collectives."""

import pytest

from hvdplus.common.reduce_ops import Sum
from hvdplus.engine.negotiation import Coordinator
from hvdplus.engine.protocol import Agreement, Collective, Outcome, Request
from hvdplus.engine.stall_inspector import StallInspector


def allreduce(name):
    return Request(Collective.ALLREDUCE, name, Agreement(dtype="float32", shape=(2,), reduce_op=Sum, prescale=1.0,
                                                         postscale=1.0))


class Job:
    """A coordinator of `size` ranks and an inspector on one clock, moved by `at`."""

    def __init__(self, size=2, check_s=2.0, shutdown_s=0.0):
        self.now = 0.0
        self.reports = []
        self.coordinator = Coordinator(size, 1 << 20, 16, clock=lambda: self.now)
        self.inspector = StallInspector(check_s, shutdown_s, clock=lambda: self.now, report=self.reports.append)

    def at(self, seconds):
        """Look at `seconds` on the clock, as the engine's steps do; the batches it returns."""
        self.now = seconds
        return self.inspector.batches(self.coordinator)

    def step_every(self, step_s, until):
        """Look every `step_s` up to `until`; every batch returned."""
        batches, ticks = [], round(until / step_s)
        for tick in range(1, ticks + 1):
            batches += self.at(tick * step_s)
        return batches


def test_a_stall_is_reported_once_per_check_time_not_at_every_look():
    job = Job(check_s=2.0)
    job.coordinator.add(0, [allreduce("late")])
    job.step_every(0.001, until=3.0)
    assert len(job.reports) == 1, job.reports
    job.step_every(0.001, until=5.9)
    assert len(job.reports) == 2
    assert "'late' waited 2 s" in job.reports[0] and "'late' waited 4 s" in job.reports[1]


def test_a_report_names_the_missing_ranks_and_what_they_submitted_instead():
    job = Job(size=3, check_s=1.0)
    job.coordinator.add(0, [allreduce("grad.fc1")])
    job.coordinator.add(1, [allreduce("grad.fc1")])
    job.coordinator.add(2, [allreduce("grad.fc1_renamed")])
    job.at(1.5)
    (report,) = job.reports
    assert "allreduce 'grad.fc1' waited 2 s: submitted by ranks [0, 1], missing on ranks [2]" in report
    assert "allreduce 'grad.fc1_renamed' waited 2 s: submitted by ranks [2], missing on ranks [0, 1]" in report
    assert "rank 2 submitted meanwhile: allreduce 'grad.fc1_renamed'" in report
    assert "rank 0 submitted meanwhile: allreduce 'grad.fc1'" in report


def test_a_rank_with_nothing_submitted_is_said_to_have_submitted_nothing():
    job = Job(check_s=1.0)
    job.coordinator.add(0, [allreduce("x")])
    job.at(1.0)
    assert "rank 1 submitted meanwhile: nothing yet" in job.reports[0]


def test_a_name_completed_and_submitted_again_is_a_new_stall():
    job = Job(check_s=1.0)
    job.coordinator.add(0, [allreduce("step")])
    job.at(1.0)
    job.coordinator.add(1, [allreduce("step")])
    assert [batch.names for batch in job.coordinator.take_batches()] == [["step"]]
    job.coordinator.add(0, [allreduce("step")])
    job.at(1.5)
    job.at(2.6)
    assert len(job.reports) == 2


def test_past_the_shutdown_time_a_stalled_batch_names_the_stall():
    job = Job(check_s=1.0, shutdown_s=3.0)
    job.coordinator.add(0, [allreduce("never_matched")])
    assert job.step_every(0.25, until=2.75) == []
    (batch,) = job.at(3.0)
    assert batch.kind is Outcome.STALLED
    assert "after a stall of 3 s" in batch.value
    assert "allreduce 'never_matched' waited 3 s: submitted by ranks [0], missing on ranks [1]" in batch.value


@pytest.mark.parametrize("check_s, shutdown_s, reports, stalled", [
    (0.0, 3.0, 0, False),  # the check off: no reports, and no shutdown either
    (10.0, 3.0, 0, True),  # a shutdown before the first report still ends the stall
])
def test_check_and_shutdown_times_together(check_s, shutdown_s, reports, stalled):
    job = Job(check_s=check_s, shutdown_s=shutdown_s)
    job.coordinator.add(0, [allreduce("x")])
    batches = job.step_every(0.5, until=4.0)
    assert len(job.reports) == reports + stalled  # a shutdown is reported too
    assert bool(batches) is stalled
