"""An in-rank suite that fails on purpose, for tests/test_rank_reports.py: run with
`pytest tests/jobs/in_rank_failures.py --ranks 3`, each rank reports its own failures.

With SKIP_A_COLLECTIVE=1 the last rank fails before a collective its peers enter, so they
wait in it and the failed rank has to end the job."""

import os

import numpy as np

import hvdplus as hvd

hvd.init()


def test_sum_everywhere():
    assert hvd.allreduce(np.ones(3), op=hvd.Sum, name="sum")[0] == hvd.size()


def test_the_last_rank_fails_after_its_collective():
    total = hvd.allreduce(np.ones(3), op=hvd.Sum, name="after")
    assert hvd.rank() != hvd.size() - 1, f"the last rank's check, with {total[0]:.0f}"


def test_the_last_rank_fails_before_a_collective():
    if os.environ.get("SKIP_A_COLLECTIVE") == "1":
        assert hvd.rank() != hvd.size() - 1, "the last rank leaves before the collective"
    hvd.allreduce(np.ones(3), op=hvd.Sum, name="skipped")


def test_runs_after_the_failures():
    assert hvd.allreduce(np.full(2, hvd.rank()), op=hvd.Max, name="max")[0] == hvd.size() - 1
