"""Scheduler metrics computed by hand on small cases."""

from __future__ import annotations

import pytest

from cellstate.model import Claim, CommitResult, Reason, Rejection
from schedulers.metrics import SchedulerMetrics, percentile

C = Claim("j", 0, "m")


def ok(n: int = 1) -> CommitResult:
    return CommitResult(tuple(Claim("j", i, "m") for i in range(n)), (), 1)


def conflicted() -> CommitResult:
    return CommitResult((), (Rejection(C, Reason.SEQUENCE_CHANGED, "moved"),), 1)


def test_conflict_fraction_busyness_and_waste() -> None:
    m = SchedulerMetrics("batch", "0", started_at=100.0)
    m.record_decision(["a"], 2.0, [ok(3)])
    m.record_decision(["b"], 1.0, [conflicted()])
    m.record_decision(["b"], 1.0, [conflicted()])
    m.record_decision(["b"], 0.5, [ok(2)])
    m.record_decision(["c"], 0.5, [])  # decided, placed nothing, sent nothing
    assert m.conflict_fraction() == pytest.approx(2 / 2)
    assert (m.busy_useful, m.busy_wasted) == (3.0, 2.0)
    assert m.busyness(now=110.0) == pytest.approx(5.0 / 10.0)
    s = m.summary(now=110.0)
    assert s["tasks_placed"] == 5 and s["tasks_per_second"] == pytest.approx(0.5)
    assert s["attempts_per_job"] == pytest.approx(5 / 3)
    assert s["transactions"] == 4 and s["successful"] == 2 and s["conflicted"] == 2


def test_invalid_rejections_are_not_conflicts() -> None:
    m = SchedulerMetrics("batch", "0", started_at=0.0)
    bad = CommitResult((), (Rejection(C, Reason.INVALID, "no such task"),), 1)
    m.record_decision(["a"], 1.0, [bad])
    assert m.conflicted == 0 and m.successful == 0 and m.busy_useful == 1.0


def test_wait_time_mean_and_p90() -> None:
    m = SchedulerMetrics("batch", "0", started_at=0.0)
    for w in range(1, 11):
        m.record_wait(float(w))
    s = m.summary(now=10.0)
    assert s["wait_mean_s"] == pytest.approx(5.5)
    assert s["wait_p90_s"] == pytest.approx(9.1)
    assert percentile([], 0.9) == 0.0
