"""validate() as a pure function over hand-built cells: one row per rule."""

from __future__ import annotations

import re
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
    Fallback,
    GangRecord,
    GangState,
    Job,
    Machine,
    MachineState,
    Reason,
    Rejection,
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
from cellstate.validation import TransactionError, check_batch, validate, validate_many
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
    "victim of equal precedence, another scheduler's": (
        lambda: cell([running(M1, "low/0", "low", 4, precedence=5, scheduler="svc")],
                     BASE_JOBS),
        Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),)),
        Reason.PRECEDENCE_TOO_LOW),
    "victim of higher precedence, the scheduler's own": (
        lambda: cell([running(M1, "low/0", "low", 4, precedence=6)], BASE_JOBS),
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


def test_a_scheduler_may_evict_its_own_task_of_equal_precedence() -> None:
    # A fair-share scheduler reorders its own users' work at one precedence.
    snap = cell([running(M1, "low/0", "low", 4, precedence=5)], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),)))
    assert d.rejected == () and d.evicted == ("low/0",)
    assert d.tasks["low/0"].state is TaskState.PREEMPTED


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


# -- fallbacks and moves -----------------------------------------------------------

M2, M3 = machine("m2", cpu=4), machine("m3", cpu=4)
FULL_M1 = running(M1, "low/0", "low", 4)


def _fb(*mids: str, seq: int = 0) -> tuple[Fallback, ...]:
    return tuple(Fallback(m, seq) for m in mids)


def test_a_claim_takes_its_first_fallback_that_fits_and_reads_only_what_it_tried() -> None:
    snap = cell([FULL_M1, running(M2, "low/1", "low", 3), M3], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1", fallbacks=_fb("m2", "m3")),)))
    assert d.rejected == ()
    (taken,) = d.accepted
    assert taken.machine == "m3" and taken.fallbacks == ()
    assert set(d.machines) == {"m3"} and d.tasks["j/0"].machine == "m3"
    # m1 and m2 failed and the decision relies on that: both are guarded reads.
    assert d.reads.machines == {"m1", "m2", "m3"}
    assert d.claim_machines["j/0"] == {"m1", "m2", "m3"}


def test_a_claim_that_fits_its_first_machine_reads_no_fallback() -> None:
    snap = cell([M1, M2], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1", fallbacks=_fb("m2")),)))
    assert [c.machine for c in d.accepted] == ["m1"] and d.reads.machines == {"m1"}


def test_a_claim_whose_machines_all_fail_keeps_its_first_reason_and_says_why_each() -> None:
    snap = cell([FULL_M1, attrs.evolve(M2, state=MachineState.DOWN)], BASE_JOBS)
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1", fallbacks=_fb("m2", "m9")),)))
    (r,) = d.rejected
    assert r.reason is Reason.INSUFFICIENT_RESOURCES and r.dimension == "cpu"
    assert "'m2' is down" in r.detail and "unknown machine 'm9'" in r.detail
    assert d.machines == {} and d.tasks == {}


@pytest.mark.parametrize(("fallback_seq", "taken"), [(5, "m2"), (4, None)])
def test_coarse_detection_compares_each_fallback_with_the_sequence_seen_for_it(
        fallback_seq: int, taken: str | None) -> None:
    snap = cell([attrs.evolve(M1, seq=9), attrs.evolve(M2, seq=5)], BASE_JOBS)
    claim = Claim("j", 0, "m1", 8, fallbacks=_fb("m2", seq=fallback_seq))
    d = validate(snap, Transaction("batch", (claim,), detection=Detection.COARSE))
    assert [c.machine for c in d.accepted] == ([taken] if taken else [])
    if taken:
        assert d.accepted[0].seen_seq == 5
    else:
        assert d.rejected[0].reason is Reason.SEQUENCE_CHANGED


def test_later_claims_see_where_a_fallback_went() -> None:
    snap = cell([running(M1, "low/0", "low", 2), running(M2, "low/1", "low", 2)], BASE_JOBS)
    claims = (Claim("j", 0, "m1", fallbacks=_fb("m2")), Claim("j", 1, "m1", fallbacks=_fb("m2")),
              Claim("j", 2, "m2"))
    d = validate(snap, Transaction("batch", claims))
    assert [c.machine for c in d.accepted] == ["m1", "m2"]
    assert [(r.claim.index, r.reason) for r in d.rejected] == [
        (2, Reason.INSUFFICIENT_RESOURCES)]


RUNS_ON_M1 = (running(M1, "j/0", "j", 2),
              TaskRecord("j", 0, TaskState.RUNNING, "m1", "batch", "", 90))


def test_a_move_releases_the_old_allocation_in_the_same_decision() -> None:
    m1, rec = RUNS_ON_M1
    snap = cell([m1, M2], BASE_JOBS, [rec])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),)))
    assert d.rejected == () and d.evicted == ()
    assert set(d.machines) == {"m1", "m2"}
    assert d.machines["m1"].allocations == {} and set(d.machines["m2"].allocations) == {"j/0"}
    assert d.machines["m1"].settled_used == Resources()
    assert d.tasks["j/0"] == TaskRecord("j", 0, TaskState.RUNNING, "m2", "batch")
    assert d.reads.machines == {"m1", "m2"} and d.claim_machines["j/0"] == {"m1", "m2"}
    assert d.added == d.removed == {"batch": Resources.of(cpu=2, mem=1)}


def test_a_move_frees_room_for_a_later_claim_on_the_old_machine() -> None:
    m1, rec = RUNS_ON_M1
    snap = cell([running(m1, "low/0", "low", 2), M2], [*BASE_JOBS, job("k", cpu=2)], [rec])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),
                                             Claim("k", 0, "m1"))))
    assert d.rejected == () and set(d.machines["m1"].allocations) == {"low/0", "k/0"}


def test_a_move_within_a_resource_limit_at_its_limit_passes() -> None:
    m1, rec = RUNS_ON_M1
    limited = CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=2))}, 50)
    snap = cell([m1, M2], BASE_JOBS, [rec], config=limited,
                usage=[UsageRecord("batch", 50, Resources.of(cpu=2, mem=1), 60)])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),)))
    assert d.rejected == ()


@pytest.mark.parametrize(("victim_of", "reason"), [("batch", None),
                                                    ("svc", Reason.LIMIT_EXCEEDED)])
def test_at_its_limit_a_scheduler_may_replace_its_own_task(victim_of: str,
                                                           reason: Reason | None) -> None:
    # batch holds 2 cpu of its limit of 2: evicting a 2-cpu task of its own gives back
    # what the new one takes; evicting another scheduler's does not.
    limited = CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=2))}, 50)
    snap = cell([running(M1, "low/0", "low", 2, precedence=0, scheduler=victim_of)],
                [*BASE_JOBS, job("k", cpu=2, precedence=1)], config=limited,
                usage=[UsageRecord("batch", 50, Resources.of(cpu=2, mem=1), 60)])
    d = validate(snap, Transaction("batch", (Claim("k", 0, "m1", evict=("low/0",)),)))
    assert [r.reason for r in d.rejected] == ([reason] if reason else [])


def _moved(tasks: Sequence[TaskRecord], machines: Sequence[Machine], claim: Claim,
           scheduler: str = "batch") -> Rejection:
    snap = cell(machines, [*BASE_JOBS, job("svc", cpu=1, scheduler="svc")], tasks)
    d = validate(snap, Transaction(scheduler, (claim,)))
    assert d.accepted == () and d.machines == {} and d.tasks == {}
    (r,) = d.rejected
    return r


MOVE_REFUSALS: dict[str, tuple[Sequence[TaskRecord], Sequence[Machine], Claim, Reason, str]] = {
    "task runs elsewhere": (
        [TaskRecord("j", 0, TaskState.RUNNING, "m2", "batch")],
        [M1, running(M2, "j/0", "j", 2), M3], Claim("j", 0, "m3", moves_from="m1"),
        Reason.INVALID, "it is running on machine 'm2'"),
    "task is pending": ([], [M1, M2], Claim("j", 0, "m2", moves_from="m1"), Reason.INVALID,
                        "it is pending"),
    "task finished": ([TaskRecord("j", 0, TaskState.FINISHED, "m1", "batch")], [M1, M2],
                      Claim("j", 0, "m2", moves_from="m1"), Reason.INVALID, "it is finished"),
    "record says m1, machine does not hold it": (
        [RUNS_ON_M1[1]], [M1, M2], Claim("j", 0, "m2", moves_from="m1"), Reason.INVALID,
        "does not run on 'm1'"),
    "new machine full": ([RUNS_ON_M1[1]], [RUNS_ON_M1[0], running(M2, "low/0", "low", 3)],
                         Claim("j", 0, "m2", moves_from="m1"),
                         Reason.INSUFFICIENT_RESOURCES, "has 1 cpu free"),
    "another scheduler's job": (
        [TaskRecord("svc", 0, TaskState.RUNNING, "m1", "svc")],
        [running(M1, "svc/0", "svc", 1, scheduler="svc"), M2],
        Claim("svc", 0, "m2", moves_from="m1"), Reason.INVALID, "belongs to scheduler 'svc'"),
}


@pytest.mark.parametrize("name", list(MOVE_REFUSALS))
def test_moves_that_cannot_be_made_are_rejected_with_a_reason(name: str) -> None:
    tasks, machines, claim, reason, detail = MOVE_REFUSALS[name]
    r = _moved(tasks, machines, claim)
    assert r.reason is reason and detail in r.detail, r


def test_a_move_is_not_part_of_a_staged_gang() -> None:
    m1, rec = RUNS_ON_M1
    snap = cell([m1, M2], BASE_JOBS, [rec])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),),
                                   TxnMode.GANG), staging_gang="g1")
    assert d.rejected[0].reason is Reason.INVALID and "gang" in d.rejected[0].detail


MALFORMED: dict[str, tuple[Claim, str]] = {
    "too many fallbacks": (Claim("j", 0, "m1", fallbacks=_fb(*(f"x{i}" for i in range(5)))),
                           "5 fallbacks, more than the limit of 4"),
    "fallback names the first machine": (Claim("j", 0, "m1", fallbacks=_fb("m1")),
                                         "fallbacks[0]: machine 'm1' is named twice"),
    "fallback named twice": (Claim("j", 0, "m1", fallbacks=_fb("m2", "m2")),
                             "fallbacks[1]: machine 'm2' is named twice"),
    "fallback is not a Fallback": (Claim("j", 0, "m1", fallbacks=("m2",)),  # type: ignore[arg-type]
                                   "fallbacks[0] is not a Fallback"),
    "fallback with a bad seq": (Claim("j", 0, "m1", fallbacks=(Fallback("m2", -1),)),
                                "fallbacks[0]: seen_seq -1"),
    "fallback with a bad name": (Claim("j", 0, "m1", fallbacks=(Fallback("m/2"),)),
                                 "fallbacks[0]: machine 'm/2' is not a valid name"),
    "evicting claim with fallbacks": (Claim("j", 0, "m1", evict=("low/0",),
                                            fallbacks=_fb("m2")),
                                      "a claim that evicts cannot have fallbacks"),
    "move to the same machine": (Claim("j", 0, "m1", moves_from="m1"),
                                 "from 'm1' to the same machine"),
    "move from a bad name": (Claim("j", 0, "m1", moves_from="m 1"),
                             "moves_from 'm 1' is not a valid name"),
    "fallback is where it moves from": (Claim("j", 0, "m2", moves_from="m1",
                                              fallbacks=_fb("m1")),
                                        "fallbacks[0]: machine 'm1' is the one the task moves"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_fallbacks_and_moves_are_refused_naming_the_claim(name: str) -> None:
    claim, message = MALFORMED[name]
    snap = cell([M1, M2], BASE_JOBS)
    with pytest.raises(TransactionError, match=re.escape(message)) as e:
        validate(snap, Transaction("batch", (Claim("j", 1, "m1"), claim)))
    assert "claim 1" in str(e.value)


# -- several transactions ------------------------------------------------------------


def test_validate_many_decides_each_transaction_over_the_ones_before() -> None:
    snap = cell([M1, M2], [*BASE_JOBS, job("k", tasks=2, cpu=2)])
    first = Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 1, "m1")), job="j")
    second = Transaction("batch", (Claim("k", 0, "m1", fallbacks=_fb("m2")),
                                   Claim("k", 1, "m1")), job="k")
    a, b = validate_many(snap, [first, second])
    assert len(a.accepted) == 2
    assert [c.machine for c in b.accepted] == ["m2"]
    assert [(r.claim.task, r.reason) for r in b.rejected] == [
        ("k/1", Reason.INSUFFICIENT_RESOURCES)]
    assert set(b.machines["m2"].allocations) == {"k/0"}


def test_validate_many_under_coarse_detection_sees_the_machines_earlier_ones_changed() -> None:
    snap = cell([attrs.evolve(M1, seq=7), attrs.evolve(M2, seq=7)],
                [*BASE_JOBS, job("k", tasks=2, cpu=1)])
    first = Transaction("batch", (Claim("j", 0, "m1", 7),), detection=Detection.COARSE)
    second = Transaction("batch", (Claim("k", 0, "m1", 7), Claim("k", 1, "m2", 7)),
                         detection=Detection.COARSE)
    _, b = validate_many(snap, [first, second])
    # As after a separate commit of the first: m1 moved on, m2 did not.
    assert [c.task for c in b.accepted] == ["k/1"]
    assert [r.reason for r in b.rejected] == [Reason.SEQUENCE_CHANGED]


def test_a_malformed_transaction_in_a_batch_is_named_by_its_index() -> None:
    good = Transaction("batch", (Claim("j", 0, "m1"),))
    bad = Transaction("batch", (Claim("j", 1, "m1", moves_from="m1"),))
    with pytest.raises(TransactionError, match=r"^transactions\[1\]: invalid transaction: claim 0"):
        check_batch([good, bad])
    with pytest.raises(TransactionError, match="no transactions"):
        check_batch([])
