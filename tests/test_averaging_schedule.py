"""hvdplus.common.averaging_schedule's answers to where the ranks' parameters agree, against the
schedule of each step written out: next_average is the first averaging step from a step on, and
agreed_after holds after no step, a synchronous step or an averaging step, for LocalSGD's
counting (warm-up steps synchronous) and DiLoCo's (after_every: no synchronous step)."""

import pytest

from hvdplus.common.averaging_schedule import AveragingSchedule


@pytest.mark.parametrize("schedule, averaging_steps, synchronous_steps", [
    (AveragingSchedule(4, 3, "LocalSGD"), [3, 7, 11, 15, 19], [0, 1, 2]),
    (AveragingSchedule(1, 0, "LocalSGD"), list(range(20)), []),
    (AveragingSchedule.after_every(5, "DiLoCo"), [4, 9, 14, 19], []),
])
def test_the_schedule_says_where_the_ranks_agree(schedule, averaging_steps, synchronous_steps):
    assert [step for step in range(20) if schedule.averages_after(step)] == averaging_steps
    assert [step for step in range(20) if schedule.synchronous(step)] == synchronous_steps
    for step in range(16):
        assert schedule.next_average(step) == min(s for s in averaging_steps if s >= step)
    agreed = {0} | {step + 1 for step in averaging_steps + synchronous_steps}
    assert [schedule.agreed_after(taken) for taken in range(20)] == [taken in agreed for taken in range(20)]


def test_between_averages_names_the_last_step_and_the_next_averaging_step():
    schedule = AveragingSchedule.after_every(5, "DiLoCo")
    assert schedule.between_averages(5, "commit") is None
    assert schedule.between_averages(7, "commit") == (
        "commit: step 6 was a local step, so each rank holds parameters of its own until the ranks average "
        "after step 9")
