"""Aladdin+H as the flow scheduler's ``aladdin`` policy, stepped by the testing kit's
harness: the paper's Figures 1, 7, 8 and 9 give the placements the paper says; a
constrained task that fits only once another of the scheduler's tasks moves gets
there by repacking; the store refuses what another scheduler's rule forbids, and the
policy never proposes it; on random small cells no placement ever breaks an affinity
or anti-affinity rule, and affinity groups are placed all or nothing.

The paper gives Figure 1's sizes only in part (M1 has <10, 10>; T0 needs <4, 8>; M1
lacks RAM for a T1 after T0, 2 < 2.5; the RAM/CPU ratios are M1 1, M2 2, T0 2, T1 1,
T2 2/3; Fig. 1b: greedy placement strands T2). The other sizes below are ours, chosen
to agree with all of that: M2 <9, 18>, T1 <2.5, 2.5>, T2 <4.5, 3>.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from cellstate.cell import CellSnapshot
from cellstate.invariants import constraint_violations, violations
from cellstate.model import (
    Claim,
    Constraints,
    InstanceRecord,
    Job,
    Reason,
    Requirement,
    SelectorOp,
    Transaction,
)
from schedulers.flow import FlowPolicy
from schedulers.runtime import SchedulerInstance
from schedulers.testing import Harness, JobBuilder, MachineBuilder, settled

FLOW = "flow"


def app(*names: str) -> tuple[Requirement, ...]:
    return (Requirement("app", SelectorOp.IN, names),)


def task(jid: str, cpu: float, mem: float, tasks: int = 1, **rules: Any) -> JobBuilder:
    b = JobBuilder(jid).tasks(tasks).cpu(cpu).mem(mem).scheduler(FLOW).label("app", jid)
    if rules:
        b.constraints(Constraints(**rules))
    return b


def group(jid: str, cpu: float, mem: float, tasks: int) -> JobBuilder:
    """An affinity group: the job's tasks must share a machine, all or nothing."""
    return task(jid, cpu, mem, tasks, affinity=app(jid)).gang()


def cell(*machines: tuple[str, float, float]) -> Harness:
    h = Harness()
    h.admin.add_machines([MachineBuilder(m).cpu(c).mem(r).build() for m, c, r in machines])
    return h


def aladdin(h: Harness, **options: Any) -> tuple[FlowPolicy, SchedulerInstance]:
    pol = FlowPolicy(policy="aladdin", **options)
    return pol, h.add(pol, scheduler=FLOW)


def sound(snap: CellSnapshot) -> None:
    assert violations(snap) == []
    assert constraint_violations(snap) == []


def refused_for_rules(h: Harness, inst: SchedulerInstance) -> list[str]:
    return [r.detail for rec in h.committer(inst).log if rec.result is not None
            for r in rec.result.rejected if r.reason is Reason.CONSTRAINT_VIOLATED]


# -- the paper's figures -------------------------------------------------------------------


def figure_1() -> tuple[Harness, list[Job]]:
    h = cell(("M1", 10, 10), ("M2", 9, 18))
    jobs = [task("T0", 4, 8, anti_affinity=app("T2")).build(), group("T1", 2.5, 2.5, 2).build(),
            task("T2", 4.5, 3).build()]
    return h, jobs


def test_figure_1_all_tasks_placed_t0_and_t2_apart_the_t1_pair_together() -> None:
    h, jobs = figure_1()
    _, inst = aladdin(h)
    h.submit(jobs)
    h.run(settled, max_time=30)
    t0, t1, t2 = (h.machines_of(j) for j in ("T0", "T1", "T2"))
    assert all([*t0, *t1, *t2])  # every task placed
    assert t0[0] != t2[0]  # anti-affinity
    assert t1[0] == t1[1]  # affinity
    assert len({*t0, *t1, *t2}) == 2  # two machines
    # Fig. 1d: T0 (RAM/CPU 2) on M2 (ratio 2), the T1 pair (ratio 1) on M1 (ratio 1).
    assert (t0, t1, t2) == (["M2"], ["M1", "M1"], ["M1"])
    sound(h.snapshot())
    assert refused_for_rules(h, inst) == []


def test_figure_1_greedy_first_fit_strands_t2() -> None:
    """Fig. 1b, the contrast: first fit in machine order puts T0 on M1, the T1 pair on
    M2, and then T2 fits nowhere."""
    from schedulers.packing import FirstFitPolicy

    h, jobs = figure_1()
    h.add(FirstFitPolicy(), scheduler=FLOW)
    h.submit(jobs)
    h.run(lambda s: h.clock.now > 1030, max_time=60)
    assert h.machines_of("T0") == ["M1"]
    assert h.machines_of("T1") == ["M2", "M2"]
    assert h.machines_of("T2") == [""]


def test_figure_7_the_task_prefers_its_ratio_and_falls_back_when_it_is_full() -> None:
    """A two-machine cluster and one task T1 of RAM/CPU 2: groups G1 = {M1} (ratio 1)
    and G2 = {M2} (ratio 2) cost 100 and 1 for it; T1 goes to M2 while M2 has room,
    and to M1 when it has not, leaving M1 12 CPUs and 8 GB (the paper's footnote)."""
    h = cell(("M1", 16, 16), ("M2", 8, 16))
    pol, _ = aladdin(h)
    h.submit([task("T1", 4, 8).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("T1") == ["M2"]
    assert pol.planner is not None
    groups = pol.planner.groups  # type: ignore[attr-defined]
    assert groups.k == 2
    from cellstate.model import Resources

    assert groups.costs(Resources.of(cpu=4, mem=8)) == [100_000, 1_000]  # 100 and 1 units

    h = cell(("M1", 16, 16), ("M2", 8, 16))
    _other_scheduler_fills(h, "M2", 8, 16)
    aladdin(h)
    h.submit([task("T1", 4, 8).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("T1") == ["M1"]
    snap = h.snapshot()
    left = snap.machines["M1"].capacity - snap.machines["M1"].settled_used
    assert (left.get("cpu"), left.get("mem")) == (12, 8)


def test_figure_8_two_tasks_of_ratio_2_share_the_one_machine_of_ratio_2() -> None:
    """Three machines, two tasks of RAM/CPU 2 = G2's: both go to M3, one machine used
    (spreading them would take two)."""
    h = cell(("M1", 16, 16), ("M2", 16, 16), ("M3", 8, 16))
    aladdin(h)
    h.submit([task("T1", 4, 8).build(), task("T2", 4, 8).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("T1") == h.machines_of("T2") == ["M3"]


def test_figure_9a_an_affinity_group_is_one_unit_all_or_nothing() -> None:
    """Fig. 9a: the group's tasks are one virtual vertex: all on one machine, or none
    while no machine has room for all of them."""
    h = cell(("M1", 8, 8), ("M2", 8, 8))
    _, inst = aladdin(h)
    h.submit([group("V", 3, 3, 3).build()])  # 9 cpu: no machine holds the three
    h.run(lambda s: h.clock.now > 1010, max_time=30)
    assert h.machines_of("V") == ["", "", ""]
    assert not any(c.job == "V" for rec in h.committer(inst).log for c in rec.transaction.claims)
    h.submit([group("W", 2, 2, 3).build()])
    h.run(lambda s: all(h.machines_of("W")), max_time=30)
    assert len(set(h.machines_of("W"))) == 1
    sound(h.snapshot())


def test_figure_9b_anti_affinity_blacklists_the_machine_with_room() -> None:
    """Fig. 9b: T1 and T2 may not share a machine. T1 is placed on M3 (its best
    match); T2, of the same shape, is kept off M3 though M3 has room for it."""
    h = cell(("M1", 16, 16), ("M2", 16, 16), ("M3", 8, 16))
    _, inst = aladdin(h)
    h.submit([task("T1", 4, 8).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("T1") == ["M3"]
    h.submit([task("T2", 4, 8, anti_affinity=app("T1")).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("T2")[0] in ("M1", "M2")
    assert refused_for_rules(h, inst) == []
    sound(h.snapshot())


def test_affinity_to_another_application_finds_its_machines_anywhere() -> None:
    """A sidecar with affinity to the database goes where a database task runs, even
    when that machine's group is the sidecar's last choice and lies beyond the machines
    a constrained job's walk looks at (walk = 1)."""
    h = cell(("A1", 16, 16), ("A2", 16, 16), ("A3", 16, 16), ("DB", 16, 64))
    h.submit([task("db", 8, 32).build()])
    assert h.admin.commit(Transaction(FLOW, (Claim("db", 0, "DB"),))).ok
    _, inst = aladdin(h, costs={"walk": 1})
    h.submit([task("sidecar", 1, 1, affinity=app("db")).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("sidecar") == ["DB"]
    assert refused_for_rules(h, inst) == []


# -- repacking -----------------------------------------------------------------------------


def _placed_by_hand(h: Harness, where: dict[str, str], **rules: Any) -> None:
    """The flow scheduler's 4-cpu tasks placed before the policy runs."""
    h.submit([task(jid, 4, 4, **rules).build() for jid in where])
    for jid, mid in where.items():
        assert h.admin.commit(Transaction(FLOW, (Claim(jid, 0, mid),))).ok


def _moves(h: Harness, inst: SchedulerInstance) -> list[Claim]:
    return [c for rec in h.committer(inst).log if rec.result is not None
            for c in rec.result.committed if c.moves_from]


def test_repacking_moves_a_free_task_so_a_constrained_one_fits() -> None:
    """Each machine runs one of the scheduler's own 4-cpu tasks; a constrained job
    needing 6 cpu fits nowhere until one of them moves to the other machine: the round
    claims the move (moves_from) and then the placement, and both commit."""
    h = cell(("M1", 8, 8), ("M2", 8, 8))
    _placed_by_hand(h, {"a": "M1", "b": "M2"})
    _, inst = aladdin(h)
    h.submit([task("big", 6, 6, max_per_machine=1).build()])
    h.run(settled, max_time=30)
    (move,) = _moves(h, inst)
    assert h.machines_of("big") == [move.moves_from]  # the room the move freed
    assert len(set(h.machines_of("a") + h.machines_of("b"))) == 1
    sound(h.snapshot())


def test_repacking_never_moves_a_constrained_task() -> None:
    """The same cell, but the running tasks have rules of their own (moving them could
    break one): nothing moves and the big task waits."""
    h = cell(("M1", 8, 8), ("M2", 8, 8))
    _placed_by_hand(h, {"a": "M1", "b": "M2"}, anti_affinity=app("nobody"))
    _, inst = aladdin(h)
    h.submit([task("big", 6, 6, max_per_machine=1).build()])
    h.run(lambda s: h.clock.now > 1010, max_time=30)
    assert _moves(h, inst) == [] and h.machines_of("big") == [""]


def test_repacking_can_be_turned_off() -> None:
    h = cell(("M1", 8, 8), ("M2", 8, 8))
    _placed_by_hand(h, {"a": "M1", "b": "M2"})
    _, inst = aladdin(h, costs={"repack": 0})
    h.submit([task("big", 6, 6, max_per_machine=1).build()])
    h.run(lambda s: h.clock.now > 1010, max_time=30)
    assert _moves(h, inst) == [] and h.machines_of("big") == [""]


# -- other schedulers' rules ------------------------------------------------------------------


def _other_scheduler_fills(h: Harness, mid: str, cpu: float, mem: float,
                           **rules: Any) -> None:
    lease = h.admin.register_instance(InstanceRecord("svc", "0"), 10)
    h.admin.deregister_instance("svc", "0", lease)
    b = JobBuilder("hog").cpu(cpu).mem(mem).scheduler("svc").label("app", "hog")
    if rules:
        b.constraints(Constraints(**rules))
    h.admin.submit_job(b.build())
    assert h.admin.commit(Transaction("svc", (Claim("hog", 0, mid),))).ok


def test_the_store_refuses_a_claim_another_schedulers_rule_forbids() -> None:
    """The service scheduler's job on M2 keeps tasks labelled app=T off its machine:
    the store refuses the flow scheduler's claim there, and the policy, which reads
    the same rule, places T elsewhere without being refused."""
    h = cell(("M1", 16, 16), ("M2", 8, 16))
    _other_scheduler_fills(h, "M2", 1, 1, anti_affinity=app("T"))
    h.submit([task("T", 4, 8).build()])
    res = h.admin.commit(Transaction(FLOW, (Claim("T", 0, "M2"),)))
    assert res.rejected[0].reason is Reason.CONSTRAINT_VIOLATED
    assert "keeps job 'T' off" in res.rejected[0].detail
    _, inst = aladdin(h)
    h.run(settled, max_time=30)
    assert h.machines_of("T") == ["M1"]  # M2 matches its ratio, but the rule keeps it off
    assert refused_for_rules(h, inst) == []
    sound(h.snapshot())


# -- properties on random small cells -----------------------------------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[tuple[str, float, float]], list[Job], int]:
    machines = [(f"m{i}", float(draw(st.sampled_from([4, 8, 16]))),
                 float(draw(st.sampled_from([4, 8, 16, 32]))))
                for i in range(draw(st.integers(2, 6)))]
    n = draw(st.integers(1, 7))
    names = [f"j{i}" for i in range(n)]
    jobs = []
    for jid in names:
        cpu = float(draw(st.sampled_from([1, 2, 4])))
        mem = float(draw(st.sampled_from([1, 2, 4, 8])))
        kind = draw(st.sampled_from(["free", "anti", "spread", "group", "next_to"]))
        if kind == "group":
            jobs.append(group(jid, cpu, mem, draw(st.integers(2, 3))).build())
        elif kind == "anti":
            others = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2))
            jobs.append(task(jid, cpu, mem, draw(st.integers(1, 3)),
                             anti_affinity=app(*others)).build())
        elif kind == "spread":
            jobs.append(task(jid, cpu, mem, draw(st.integers(1, 4)), max_per_machine=1).build())
        elif kind == "next_to":
            jobs.append(task(jid, cpu, mem, draw(st.integers(1, 2)),
                             affinity=app(draw(st.sampled_from(names)))).build())
        else:
            jobs.append(task(jid, cpu, mem, draw(st.integers(1, 4))).build())
    return machines, jobs, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scene=scenes())
def test_no_placement_ever_breaks_a_rule_and_groups_are_all_or_nothing(
        scene: tuple[list[tuple[str, float, float]], list[Job], int]) -> None:
    machines, jobs, seed = scene
    h = cell(*machines)
    _, inst = aladdin(h)
    rng = random.Random(seed)
    rng.shuffle(jobs)
    groups = [j for j in jobs if j.gang]

    def check(_: int) -> None:
        snap = h.snapshot()
        sound(snap)
        for g in groups:
            if g.id not in snap.jobs:
                continue
            placed = [m for m in h.machines_of(g.id) if m]
            assert len(placed) in (0, g.task_count)
            assert len(set(placed)) <= 1

    h.submit(jobs[:len(jobs) // 2])
    h.run(lambda s: h.clock.now > 1005, max_time=30, each_step=check)
    h.submit(jobs[len(jobs) // 2:])
    h.run(lambda s: h.clock.now > 1020, max_time=60, each_step=check)
    check(0)
    # The policy itself proposes nothing a rule forbids: the store refused nothing so.
    assert refused_for_rules(h, inst) == []


def test_repacking_moves_only_the_tasks_the_arrival_needs_moved() -> None:
    """Three machines, four of the scheduler's free 4-cpu tasks (M3 full): the 6-cpu
    constrained job fits nowhere; one move (a task off the machine it then takes) makes
    room, and no other task moves."""
    h = cell(("M1", 8, 8), ("M2", 8, 8), ("M3", 8, 8))
    where = {"a": "M1", "b": "M2", "c": "M3", "d": "M3"}
    _placed_by_hand(h, where)
    _, inst = aladdin(h)
    h.submit([task("big", 6, 6, max_per_machine=1).build()])
    h.run(settled, max_time=30)
    (move,) = _moves(h, inst)
    (landed,) = h.machines_of("big")
    assert move.moves_from == landed
    moved = move.job
    assert where[moved] == landed
    for jid, mid in where.items():
        if jid != moved:
            assert h.machines_of(jid) == [mid]  # not needed, not moved
    sound(h.snapshot())


def test_two_repacks_in_one_round_move_different_tasks() -> None:
    """Two constrained jobs (6 and 5 cpu), each machine a 4-cpu task: M1 and M2 run
    free tasks (and a 1-cpu one each, so that no mover fits there), M3 and M4
    constrained ones. Each job needs one free task moved to M3 or M4. The first takes
    M1 (first in order) by moving its 4-cpu task; that task is no longer M1's to move,
    so the second, whose lack on M1 it would cover, moves M2's instead. Two moves of
    two tasks, nothing refused."""
    h = cell(("M1", 8, 8), ("M2", 8, 8), ("M3", 8, 8), ("M4", 8, 8))
    _placed_by_hand(h, {"a": "M1", "b": "M2"})
    _placed_by_hand_sized(h, "e", 1, 1, "M1")
    _placed_by_hand_sized(h, "f", 1, 1, "M2")
    _placed_by_hand(h, {"c": "M3", "d": "M4"}, anti_affinity=app("nobody"))
    _, inst = aladdin(h)
    h.submit([task("big1", 6, 6, max_per_machine=1).build(),
              task("big2", 5, 5, max_per_machine=1).build()])
    h.run(settled, max_time=30)
    moves = _moves(h, inst)
    assert sorted(c.job for c in moves) == ["a", "b"]
    assert sorted(h.machines_of("big1") + h.machines_of("big2")) == ["M1", "M2"]
    assert not [r for rec in h.committer(inst).log if rec.result is not None
                for r in rec.result.rejected]
    sound(h.snapshot())


# -- the packing cost --------------------------------------------------------------------------


def _half_full_m4(pack: int) -> Harness:
    h = cell(*((f"M{i}", 16, 16) for i in range(1, 5)))
    _placed_by_hand_sized(h, "hog", 8, 8, "M4")
    aladdin(h, costs={"pack": pack})
    h.submit([task("j", 2, 2, tasks=2).build()])
    h.run(settled, max_time=30)
    return h


def _placed_by_hand_sized(h: Harness, jid: str, cpu: float, mem: float, mid: str) -> None:
    h.submit([task(jid, cpu, mem).build()])
    assert h.admin.commit(Transaction(FLOW, (Claim(jid, 0, mid),))).ok


def test_the_packing_cost_sends_tasks_to_the_fuller_machine_of_the_group() -> None:
    """Four machines of one shape (one group), the last by name half full: with the
    packing cost the two tasks join it; without it (pack = 0, the paper's equal
    costs) the group's machines cost alike and they go elsewhere."""
    assert _half_full_m4(1).machines_of("j") == ["M4", "M4"]
    assert "M4" not in _half_full_m4(0).machines_of("j")


def test_the_packing_cost_prefers_fuller_then_bigger_machines() -> None:
    from cellstate.model import Resources
    from schedulers.api import CellView
    from schedulers.flow.aladdin.cellarrays import CellArrays
    from schedulers.flow.aladdin.groups import group_machines

    h = cell(("A", 16, 16), ("B", 16, 16), ("C", 32, 32))
    _placed_by_hand_sized(h, "x", 8, 8, "B")
    snap = h.snapshot()
    view = CellView(snap, FLOW)
    groups = group_machines([m.capacity for m in snap.machines.values()], 1)
    need = [Resources.of(cpu=1, mem=1)]
    a, b, c = CellArrays(view, groups, need).pack().tolist()
    assert b < a  # fuller first
    assert c < a  # bigger first, at the same fill
    assert CellArrays(view, groups, need, packing=False).pack().tolist() == [0, 0, 0]
