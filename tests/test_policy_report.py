"""A policy's own metrics (``Policy.report``): merged into what an instance reports,
checked on the way, and the flow scheduler's rounds summed up in them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import pytest

from cellstate.invariants import placed_tasks_of
from cellstate.model import Job
from omega.statusfmt import status_text
from schedulers.api import Context, Plan, Policy
from schedulers.batch import BatchPolicy
from schedulers.flow import FlowPolicy
from schedulers.flow.policy import RECENT
from schedulers.runtime import MAX_POLICY_REPORT
from schedulers.testing import Harness, job, machine, settled


class Reporting(BatchPolicy):
    """The batch policy with a report given by the test."""

    def __init__(self, report: Any) -> None:
        super().__init__()
        self._given = report

    def report(self) -> Mapping[str, float | int]:
        if isinstance(self._given, Exception):
            raise self._given
        return self._given  # type: ignore[no-any-return]


def _summary(policy: Policy) -> dict[str, Any]:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    inst = h.add(policy, scheduler="batch")
    h.submit([job("j", tasks=2)])
    h.run(settled)
    return inst.metrics_summary(h.clock())


def test_a_policy_without_a_report_adds_nothing() -> None:
    s = _summary(BatchPolicy())
    assert "policy" not in s and s["tasks_placed"] == 2


def test_a_policys_report_is_merged_under_policy() -> None:
    s = _summary(Reporting({"widgets": 3, "spin_ms": 1.5}))
    assert s["policy"] == {"widgets": 3, "spin_ms": 1.5}
    assert s["tasks_placed"] == 2  # the runtime's own metrics are all there


@pytest.mark.parametrize(
    "report",
    [
        {"solve_ms": float("nan")},
        {"solve_ms": float("inf")},
        {"ok": True},
        {"name": "quincy"},
        {"": 1},
        {"x" * 65: 1},
        {f"k{i}": i for i in range(MAX_POLICY_REPORT + 1)},
        ["not", "a", "mapping"],
        RuntimeError("a plugin's bug"),
    ],
    ids=["nan", "inf", "bool", "text", "empty-name", "long-name", "too-many", "list", "raises"],
)
def test_a_bad_report_is_left_out_and_the_runtimes_metrics_stay(report: Any) -> None:
    s = _summary(Reporting(report))
    assert "policy" not in s
    assert s["tasks_placed"] == 2


def _flow_harness() -> tuple[Harness, FlowPolicy, Any]:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4, rack=f"r{i // 2}") for i in range(6)])
    policy = FlowPolicy(policy="load-spread", interval=1.0)
    inst = h.add(policy, scheduler="flow")
    return h, policy, inst


def test_the_flow_scheduler_reports_its_rounds() -> None:
    h, policy, inst = _flow_harness()
    # Jobs arriving one after another: several rounds, each placing what came.
    for i, tasks in enumerate((3, 5, 2, 4)):
        h.submit([job(f"j{i}", tasks=tasks, cpu=1, scheduler="flow")])
        h.run(settled)
    snap = h.snapshot()
    assert sum(placed_tasks_of(snap, f"j{i}") for i in range(4)) == 14
    report = inst.metrics_summary(h.clock())["policy"]
    rounds = list(policy.rounds)
    assert len(rounds) >= 4
    last = rounds[-1]
    assert report["rounds"] == len(rounds)
    assert report["placed"] == sum(r.placed for r in rounds) == 14
    assert report["moved"] == sum(r.migrated for r in rounds)
    assert report["preempted"] == sum(r.preempted for r in rounds)
    assert report["full_builds"] == sum(r.full_build for r in rounds) >= 1
    assert (report["last_placed"], report["last_nodes"], report["last_arcs"]) == (
        last.placed, last.nodes, last.arcs)
    assert report["last_solve_ms"] == pytest.approx(1000 * last.solve)
    assert report["median_solve_ms"] == pytest.approx(
        1000 * statistics.median(r.solve for r in rounds))
    assert report["median_update_ms"] == pytest.approx(
        1000 * statistics.median(r.update for r in rounds))


def test_flow_medians_cover_the_recent_rounds_and_totals_every_round() -> None:
    h, policy, _ = _flow_harness()
    for i in range(RECENT + 5):
        h.submit([job(f"j{i}", tasks=1, cpu=0.01, mem=0.01, scheduler="flow")])
        h.run(settled)
    rounds = list(policy.rounds)
    report = policy.report()
    assert report["rounds"] == len(rounds) > RECENT
    assert report["placed"] == RECENT + 5
    recent = rounds[-RECENT:]
    assert report["median_extract_ms"] == pytest.approx(
        1000 * statistics.median(r.extract for r in recent))


def test_status_text_shows_the_flow_rounds() -> None:
    h, _, inst = _flow_harness()
    h.submit([job("j", tasks=5, cpu=1, scheduler="flow")])
    h.run(settled)
    summary = inst.metrics_summary(h.clock())
    status = {"revision": 9, "server": "s", "machines_up": 6, "machines_down": 0,
              "agents": 1, "capacity": {"cpu": 24.0}, "used": {"cpu": 5.0},
              "jobs": {"running": 1}, "tasks": {"running": 5},
              "schedulers": [summary]}
    text = status_text(status)
    line = next(x for x in text.splitlines() if "rounds" in x)
    assert line.startswith("    rounds 1: ")
    assert "5 placements proposed, 0 moved, 0 preempted" in line and "median solve" in line
    assert "in all 5 placements proposed" in line


def test_status_text_shows_another_policys_report_as_pairs() -> None:
    status = {"revision": 9, "server": "s", "machines_up": 1, "machines_down": 0,
              "agents": 1, "capacity": {"cpu": 4.0}, "used": {}, "jobs": {}, "tasks": {},
              "schedulers": [{"scheduler": "x", "instance": "0",
                              "policy": {"widgets": 3, "spin_ms": 1.25}}]}
    assert "    policy: spin_ms=1.25, widgets=3" in status_text(status).splitlines()


class Quiet(Policy):
    """A policy with no hooks but a report: the default report is empty."""

    name = "quiet"

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        return Plan()


def test_the_default_report_is_empty() -> None:
    assert Quiet().report() == {}
