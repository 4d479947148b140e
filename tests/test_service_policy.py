"""The service scheduler's choices on hand-made cells: its ``score`` option (pack vs
spread) and its spreading over failure domains and racks, then preemption.

Machines are filled to distinct levels so no choice is a tie (the cell's machine map
iterates in hash order, so a tie would be decided differently from run to run); the
expected placements are worked out by hand in each test's comment."""

from __future__ import annotations

import random

import pytest

from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Job, JobKind, Machine, Transaction
from schedulers.api import CellView, Context, Plan
from schedulers.service import ServicePolicy
from schedulers.testing import job, machine, make_cell

# cpu used on each machine (of 8) by a filler job's tasks of 0.5 cpu each.
FILL = {"m0": 4.0, "m1": 2.0, "m2": 1.5, "m3": 0.0}


def _cell(machines: list[Machine], *jobs: Job, fill: dict[str, float] = FILL) -> CellView:
    filler = job("fill", tasks=64, cpu=0.5, mem=0, scheduler="other")
    store = make_cell(MemoryKV(), machines, [filler, *jobs])
    index = 0
    claims = []
    for mid, used in fill.items():
        for _ in range(int(used / 0.5)):
            claims.append(Claim("fill", index, mid))
            index += 1
    res = store.commit(Transaction("other", tuple(claims)))
    assert not res.rejected
    return CellView(store.read_snapshot(), "service")


def _machines(racks: dict[str, str] | None = None,
              domains: dict[str, str] | None = None) -> list[Machine]:
    return [machine(mid, cpu=8, mem=16, rack=(racks or {}).get(mid, ""),
                    failure_domain=(domains or {}).get(mid, "")) for mid in FILL]


def _web(tasks: int, cpu: float = 1, precedence: int = 0) -> Job:
    # cpu only, so rooms (free fractions summed over dimensions) differ as cpu does.
    return job("web", tasks=tasks, cpu=cpu, mem=0, scheduler="service",
               kind=JobKind.SERVICE, precedence=precedence)


def _plan(view: CellView, j: Job, **options: object) -> Plan:
    ctx = Context(view, 0.0, random.Random(0), "service", "0")
    return ServicePolicy(**options).schedule_job(ctx, view.jobs[j.id])


def _where(plan: Plan) -> list[str]:
    return [c.machine for c in plan.claims]


def test_spread_takes_the_emptiest_machine_and_pack_the_fullest() -> None:
    web = _web(1)
    assert _where(_plan(_cell(_machines(), web), web, score="spread")) == ["m3"]
    assert _where(_plan(_cell(_machines(), web), web, score="pack")) == ["m0"]
    assert _where(_plan(_cell(_machines(), web), web)) == ["m3"]  # spread by default


def test_each_placement_sees_the_ones_before_it() -> None:
    """No racks or domains: pack keeps filling m0 (4, 5, 6 cpu used); spread puts two
    on the empty m3 (0, then 1 used: still the emptiest), then m2 (1.5 against 2)."""
    web = _web(3)
    assert _where(_plan(_cell(_machines(), web), web, score="pack")) == ["m0"] * 3
    assert _where(_plan(_cell(_machines(), web), web, score="spread")) == ["m3", "m3", "m2"]


def test_the_score_may_come_from_the_schedulers_options() -> None:
    web = _web(1)
    view = _cell(_machines(), web)
    ctx = Context(view, 0.0, random.Random(0), "service", "0", options={"score": "pack"})
    assert _where(ServicePolicy().schedule_job(ctx, view.jobs["web"])) == ["m0"]


RACKS = {"m0": "r0", "m1": "r0", "m2": "r1", "m3": "r1"}


def test_tasks_spread_over_racks_before_the_score_decides() -> None:
    """Racks r0 = {m0, m1}, r1 = {m2, m3}. Pack: m0 (fullest), then the other rack's
    fullest, m2, then back to m0 (one task in each rack), then m2. Without rack
    spreading pack would put all four on m0."""
    web = _web(4)
    assert _where(_plan(_cell(_machines(RACKS), web), web, score="pack")) == [
        "m0", "m2", "m0", "m2"]


def test_spread_also_spreads_over_racks_first() -> None:
    """Spread: the emptiest, m3 (r1), then r0's emptiest, m1 (2 used), though m3 (1
    used) and m2 (1.5) have more room."""
    web = _web(2)
    assert _where(_plan(_cell(_machines(RACKS), web), web, score="spread")) == ["m3", "m1"]


def test_failure_domains_come_before_racks() -> None:
    """d0 = {m0 (rack r0), m1 (rack r1)}, d1 = {m2 (rack r2)}; m3 is not used (down).
    Pack: m0, then the other domain, m2 (though m1 in the empty rack r1 is fuller),
    then d0 again but rack r1: m1."""
    machines = _machines({"m0": "r0", "m1": "r1", "m2": "r2", "m3": "r3"},
                         {"m0": "d0", "m1": "d0", "m2": "d1", "m3": "d1"})
    machines[3] = machine("m3", cpu=0.5, mem=16, rack="r3", failure_domain="d1")
    web = _web(3)
    view = _cell(machines, web, fill={**FILL, "m3": 0.5})
    assert _where(_plan(view, web, score="pack")) == ["m0", "m2", "m1"]


def test_a_full_cell_preempts_the_fewest_lowest_precedence_tasks() -> None:
    """Every machine is full. On m0 one filler task of precedence 0 must go to make
    room for 0.5 cpu; elsewhere the service job would have to evict a task of
    precedence 5. The cheapest set is one precedence-0 task on m0."""
    machines = [machine("m0", cpu=4, mem=16), machine("m1", cpu=1, mem=16)]
    low = job("low", tasks=8, cpu=0.5, mem=0, scheduler="other")
    high = job("high", tasks=1, cpu=1, mem=0, scheduler="other", precedence=5)
    web = _web(1, cpu=0.5, precedence=3)
    store = make_cell(MemoryKV(), machines, [low, high, web])
    res = store.commit(Transaction("other", tuple(
        [Claim("low", i, "m0") for i in range(8)] + [Claim("high", 0, "m1")])))
    assert not res.rejected
    view = CellView(store.read_snapshot(), "service")
    plan = _plan(view, web)
    assert _where(plan) == ["m0"]
    assert plan.claims[0].evict == ("low/0",)  # ties by precedence go by task id
    assert _plan(CellView(store.read_snapshot(), "service"), web, preempt=False).claims == ()


@pytest.mark.parametrize("score", ["best", 1, None])
def test_a_bad_score_is_refused_at_start_up(score: object) -> None:
    with pytest.raises(ValueError, match="option score must be spread or pack"):
        ServicePolicy(score=score)
