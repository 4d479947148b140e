"""validate() as a pure function over hand-built cells: one row per rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import immutables
import pytest

from cellstate.cell import CellSnapshot
from cellstate.model import (
    Allocation,
    CellConfig,
    Claim,
    Constraints,
    Detection,
    GangRecord,
    GangState,
    Job,
    Machine,
    MachineState,
    Reason,
    Requirement,
    Resources,
    SchedulerLimits,
    SelectorOp,
    TaskRecord,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
)
from cellstate.validation import validate
from schedulers.testing import job, machine


def cell(
    machines: Sequence[Machine],
    jobs: Sequence[Job],
    tasks: Sequence[TaskRecord] = (),
    config: CellConfig | None = None,
    gangs: Sequence[GangRecord] = (),
    usage: Sequence[UsageRecord] = (),
) -> CellSnapshot:
    return CellSnapshot(
        100, config or CellConfig(),
        immutables.Map({m.id: m for m in machines}),
        immutables.Map({j.id: j for j in jobs}),
        immutables.Map({t.id: t for t in tasks}),
        immutables.Map({g.id: g for g in gangs}),
        immutables.Map({u.scheduler: u for u in usage}),
        immutables.Map(), immutables.Map(), immutables.Map(), immutables.Map(),
    )


def running(m: Machine, tid: str, job_id: str, cpu: float, precedence: int = 0,
            scheduler: str = "batch", **tags: str) -> Machine:
    a = Allocation(tid, job_id, scheduler, precedence, Resources.of(cpu=cpu, mem=1), **tags)
    return attrs.evolve(m, allocations={**m.allocations, tid: a})


M1 = machine("m1", cpu=4)
BASE_JOBS = [job("j", tasks=4, cpu=2), job("low", cpu=2, precedence=1),
             job("hi", cpu=4, precedence=5)]
Case = tuple[Callable[[], CellSnapshot], Transaction, Reason]

CASES: dict[str, Case] = {
    "unknown job": (lambda: cell([M1], BASE_JOBS),
                    Transaction("batch", (Claim("nope", 0, "m1"),)), Reason.INVALID),
    "other scheduler's job": (lambda: cell([M1], BASE_JOBS),
                              Transaction("svc", (Claim("j", 0, "m1"),)), Reason.INVALID),
    "task out of range": (lambda: cell([M1], BASE_JOBS),
                          Transaction("batch", (Claim("j", 4, "m1"),)), Reason.INVALID),
    "already running": (
        lambda: cell([running(M1, "j/0", "j", 2)], BASE_JOBS,
                     [TaskRecord("j", 0, TaskState.RUNNING, "m1", "batch", "", 90)]),
        Transaction("batch", (Claim("j", 0, "m1"),)), Reason.TASK_ALREADY_PLACED),
    "reserved by a gang in flight": (
        lambda: cell([M1], BASE_JOBS,
                     [TaskRecord("j", 0, TaskState.RUNNING, "m1", "batch", "g1", 90)],
                     gangs=[GangRecord("g1", "batch", GangState.PREPARING, 1)]),
        Transaction("batch", (Claim("j", 0, "m1"),)), Reason.TASK_ALREADY_PLACED),
    "unknown machine": (lambda: cell([M1], BASE_JOBS),
                        Transaction("batch", (Claim("j", 0, "m9"),)), Reason.UNKNOWN_MACHINE),
    "coarse, sequence moved": (
        lambda: cell([attrs.evolve(M1, seq=7)], BASE_JOBS),
        Transaction("batch", (Claim("j", 0, "m1", 6),), detection=Detection.COARSE),
        Reason.SEQUENCE_CHANGED),
    "draining machine": (lambda: cell([attrs.evolve(M1, state=MachineState.DRAINING)], BASE_JOBS),
                         Transaction("batch", (Claim("j", 0, "m1"),)), Reason.MACHINE_DOWN),
    "precedence above the scheduler's limit": (
        lambda: cell([M1], BASE_JOBS, config=CellConfig({"batch": SchedulerLimits(4)})),
        Transaction("batch", (Claim("hi", 0, "m1"),)), Reason.LIMIT_EXCEEDED),
    "victim of equal precedence": (
        lambda: cell([running(M1, "low/0", "low", 4, precedence=5)], BASE_JOBS),
        Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),)),
        Reason.PRECEDENCE_TOO_LOW),
    "selector": (
        lambda: cell([M1], [job("j", constraints=Constraints(machine_selector=(
            Requirement("rack", SelectorOp.IN, ("r9",)),)))]),
        Transaction("batch", (Claim("j", 0, "m1"),)), Reason.CONSTRAINT_VIOLATED),
    "does not fit": (lambda: cell([running(M1, "low/0", "low", 3)], BASE_JOBS),
                     Transaction("batch", (Claim("j", 0, "m1"),)), Reason.INSUFFICIENT_RESOURCES),
    "preparing gang's hold counts": (
        lambda: cell([running(M1, "x/0", "low", 3, gang="g1")], BASE_JOBS,
                     gangs=[GangRecord("g1", "batch", GangState.PREPARING, 1)]),
        Transaction("batch", (Claim("j", 0, "m1"),)), Reason.INSUFFICIENT_RESOURCES),
    "resource limit": (
        lambda: cell([M1], BASE_JOBS,
                     config=CellConfig({"batch": SchedulerLimits(
                         max_resources=Resources.of(cpu=3))}, 50),
                     usage=[UsageRecord("batch", 50, Resources.of(cpu=2), 60)]),
        Transaction("batch", (Claim("j", 0, "m1"),)), Reason.LIMIT_EXCEEDED),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_rejects_with_its_reason(name: str) -> None:
    make, txn, reason = CASES[name]
    snap = make()
    before = {m: dict(x.allocations) for m, x in snap.machines.items()}
    decision = validate(snap, txn)
    assert [r.reason for r in decision.rejected] == [reason]
    assert decision.accepted == () and decision.machines == {} and decision.tasks == {}
    assert {m: dict(x.allocations) for m, x in snap.machines.items()} == before  # pure


def test_aborted_gang_hold_is_void_and_dropped_on_rewrite() -> None:
    snap = cell([running(M1, "x/0", "low", 3, gang="gone")], BASE_JOBS)
    decision = validate(snap, Transaction("batch", (Claim("j", 0, "m1"),)))
    assert decision.rejected == ()
    assert set(decision.machines["m1"].allocations) == {"j/0"}


def test_eviction_frees_room_and_marks_the_victim_preempted() -> None:
    snap = cell([running(M1, "low/0", "low", 2, precedence=1)], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),)))
    assert d.rejected == () and d.evicted == ("low/0",)
    assert set(d.machines["m1"].allocations) == {"hi/0"}
    assert d.tasks["low/0"].state is TaskState.PREEMPTED
    assert d.tasks["hi/0"].state is TaskState.RUNNING and d.tasks["hi/0"].machine == "m1"
    assert d.reads.machines == {"m1"} and d.reads.tasks == {"hi/0", "low/0"}
    assert d.removed == {"batch": Resources.of(cpu=2, mem=1)}


def test_staging_tags_placements_and_marks_victims() -> None:
    snap = cell([running(M1, "low/0", "low", 2, precedence=1)], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),),
                                   TxnMode.GANG), staging_gang="g7")
    allocs = d.machines["m1"].allocations
    assert allocs["hi/0"].gang == "g7" and allocs["low/0"].evicted_by == "g7"
    assert "low/0" not in d.tasks  # the victim's record changes only at the commit point
    assert d.tasks["hi/0"].gang == "g7"


def test_coarse_detection_forgives_the_transactions_own_earlier_writes() -> None:
    snap = cell([attrs.evolve(M1, seq=12)], BASE_JOBS)
    t = Transaction("batch", (Claim("j", 1, "m1", 10),), detection=Detection.COARSE)
    assert validate(snap, t).rejected[0].reason is Reason.SEQUENCE_CHANGED
    assert validate(snap, t, seq_rewrites={"m1": (10, 12)}).rejected == ()


def test_a_neighbour_rule_brought_in_earlier_in_the_transaction_counts() -> None:
    """Claim 2 swaps m1's two tasks for one of "guard", whose anti-affinity keeps "calm"
    off, leaving m1 with as many allocations as after claim 1. Claim 3 must still see
    guard's rule (a cache keyed by machine, sequence and number of allocations did not)."""
    m = running(running(machine("m1", cpu=8), "a/0", "a", 1), "b/0", "b", 1)
    keep_calm_off = Constraints(anti_affinity=(Requirement("app", SelectorOp.IN, ("calm",)),))
    snap = cell([m], [job("a"), job("b"), job("x"), job("calm", labels=[("app", "calm")]),
                      job("guard", precedence=5, constraints=keep_calm_off)])
    d = validate(snap, Transaction("batch", (
        Claim("x", 0, "m1"), Claim("guard", 0, "m1", evict=("a/0", "b/0")), Claim("calm", 0, "m1"),
    )))
    assert [c.task for c in d.accepted] == ["x/0", "guard/0"]
    (r,) = d.rejected
    assert (r.claim.task, r.reason) == ("calm/0", Reason.CONSTRAINT_VIOLATED)
    assert r.detail == "anti-affinity: job 'guard' on machine 'm1' keeps job 'calm' off"
