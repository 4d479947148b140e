"""What validate() decides an accepted claim writes, record by record: the allocation
(scheduler, precedence), the victim's task record, the settled sums that later claims
of the same transaction fit against, what each scheduler adds and frees, and the
rules a staged gang's own evictions and an affinity group's founding claim relax.
Written against the survivors of a mutation-testing run (docs/testing.md)."""

from __future__ import annotations

import attrs

from cellstate import admission, codec
from cellstate.model import (
    OPPORTUNISTIC_PRECEDENCE,
    Allocation,
    CellConfig,
    Claim,
    Constraints,
    Fallback,
    GangRecord,
    GangState,
    Job,
    JobKind,
    MachineState,
    MapReduceSpec,
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
    required_tasks,
    task_precedence,
)
from cellstate.validation import validate
from schedulers.testing import job, machine
from tests.test_validation import cell, running

CPU2 = Resources.of(cpu=2, mem=1)


def _mapreduce(jid: str, workers: int, max_workers: int, precedence: int = 3) -> Job:
    spec = MapReduceSpec(maps=4, reduces=1, map_seconds=1.0, reduce_seconds=1.0,
                         workers=workers, max_workers=max_workers)
    return attrs.evolve(job(jid, tasks=max_workers, cpu=1, precedence=precedence),
                        kind=JobKind.MAPREDUCE, mapreduce=spec)


def test_a_mapreduce_job_requires_only_the_workers_it_asked_for() -> None:
    assert required_tasks(_mapreduce("mr", workers=2, max_workers=4)) == 2
    assert required_tasks(job("b", tasks=3)) == 3


def test_a_mapreduce_jobs_extra_workers_run_at_opportunistic_precedence() -> None:
    mr = _mapreduce("mr", workers=2, max_workers=4)
    assert [task_precedence(mr, i) for i in range(4)] == [3, 3, OPPORTUNISTIC_PRECEDENCE,
                                                          OPPORTUNISTIC_PRECEDENCE]
    assert task_precedence(job("b", precedence=2), 7) == 2


def test_an_accepted_claim_writes_its_allocation_and_task_record() -> None:
    mr = _mapreduce("mr", workers=1, max_workers=2)
    snap = cell([machine("m1", cpu=8)], [mr])
    d = validate(snap, Transaction("batch", (Claim("mr", 0, "m1"), Claim("mr", 1, "m1"))))
    res = Resources.of(cpu=1, mem=1)
    assert dict(d.machines["m1"].allocations) == {
        "mr/0": Allocation("mr/0", "mr", "batch", 3, res),
        "mr/1": Allocation("mr/1", "mr", "batch", OPPORTUNISTIC_PRECEDENCE, res)}
    assert d.tasks["mr/1"] == TaskRecord("mr", 1, TaskState.RUNNING, "m1", "batch")
    # Both claims count: what the scheduler adds is their sum.
    assert d.added == {"batch": Resources.of(cpu=2, mem=2)}
    assert d.machines["m1"].settled_used == Resources.of(cpu=2, mem=2)


def test_evictions_write_the_victims_records_and_free_their_sum() -> None:
    m1 = running(running(machine("m1", cpu=6), "a/0", "a", 2), "b/0", "b", 2, scheduler="svc")
    m1 = running(m1, "c/0", "c", 2)
    snap = cell([m1], [job("a", cpu=2), job("b", cpu=2, scheduler="svc"), job("c", cpu=2),
                       job("hi", cpu=2, precedence=5), job("hj", cpu=2, precedence=5)])
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("a/0", "b/0")),
                                             Claim("hj", 0, "m1", evict=("c/0",)))))
    assert not d.rejected, d.rejected
    assert d.evicted == ("a/0", "b/0", "c/0")
    assert d.tasks["a/0"] == TaskRecord("a", 0, TaskState.PREEMPTED, "m1", "batch")
    assert d.tasks["b/0"] == TaskRecord("b", 0, TaskState.PREEMPTED, "m1", "svc")
    assert d.removed == {"batch": Resources.of(cpu=4, mem=2), "svc": CPU2}
    # What later claims fit against is what stays: hi/0 and hj/0.
    assert sorted(d.machines["m1"].allocations) == ["hi/0", "hj/0"]
    assert d.machines["m1"].settled_used == Resources.of(cpu=4, mem=2)


def test_settled_room_after_an_eviction_is_what_stays() -> None:
    """m1 (4 cpu) runs low/0 and low/1 (2 each); hi/0 evicts low/0 and takes 2: full. A
    second task in the same transaction does not fit, and a third that evicts low/1
    does."""
    m1 = running(running(machine("m1", cpu=4), "low/0", "low", 2), "low/1", "low", 2)
    snap = cell([m1], [job("low", tasks=2, cpu=2), job("hi", tasks=3, cpu=2, precedence=5)])
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),
                                             Claim("hi", 1, "m1"),
                                             Claim("hi", 2, "m1", evict=("low/1",)))))
    assert [c.task for c in d.accepted] == ["hi/0", "hi/2"]
    assert [(r.claim.task, r.reason) for r in d.rejected] == [
        ("hi/1", Reason.INSUFFICIENT_RESOURCES)]
    assert d.machines["m1"].settled_used == Resources.of(cpu=4, mem=2)


def test_evicting_a_task_a_committed_gang_placed_frees_its_room_once() -> None:
    """x/0's hold is tagged with its committed gang, so it is outside the settled sum:
    evicting it must not take it off that sum too (y/0 still holds 2 of 4)."""
    m1 = running(running(machine("m1", cpu=4), "x/0", "x", 2, gang="g1"), "y/0", "y", 2)
    snap = cell([m1], [job("x", cpu=2), job("y", cpu=2), job("hi", cpu=1, precedence=5),
                       job("z", cpu=2)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch", "g1")],
                gangs=[GangRecord("g1", "batch", GangState.COMMITTED, 1)])
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("x/0",)),
                                             Claim("z", 0, "m1"))))
    assert [c.task for c in d.accepted] == ["hi/0"]
    assert [(r.claim.task, r.detail) for r in d.rejected] == [
        ("z/0", "machine 'm1' has 1 cpu free, task needs 2")]


def test_a_victim_that_is_not_placed_there_is_refused() -> None:
    staged = running(machine("m1", cpu=4), "x/0", "x", 1, gang="g1")  # preparing: not placed
    snap = cell([staged], [job("x", cpu=1), job("hi", cpu=1, precedence=5)],
                gangs=[GangRecord("g1", "batch", GangState.PREPARING, 1)])
    for victim in ("x/0", "nope/0"):
        claim = Claim("hi", 0, "m1", evict=(victim,))
        d = validate(snap, Transaction("batch", (claim,)))
        assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
            (claim, Reason.INVALID, f"cannot evict {victim}: it does not run on 'm1'")]


def test_a_mapreduce_worker_may_evict_its_schedulers_extra_workers() -> None:
    """Extra workers run at OPPORTUNISTIC_PRECEDENCE: a requested worker (precedence 0)
    evicts one of another job."""
    m1 = running(machine("m1", cpu=1), "old/1", "old", 1, precedence=OPPORTUNISTIC_PRECEDENCE)
    snap = cell([m1], [_mapreduce("old", 1, 2, precedence=0), _mapreduce("new", 1, 2, 0)])
    d = validate(snap, Transaction("batch", (Claim("new", 0, "m1", evict=("old/1",)),)))
    assert not d.rejected, d.rejected
    assert d.evicted == ("old/1",)


# -- staged gangs: their own evictions count as done ------------------------------------


def test_a_staged_gangs_own_eviction_frees_room_for_its_next_claim() -> None:
    """m1 (6 cpu) runs x/0 and low/0 (2 each). The gang's hi/0 (1) evicts low/0; j/0 (3)
    fits only if the eviction counts as done and hi/0's staged hold counts as held."""
    m1 = running(running(machine("m1", cpu=6), "x/0", "x", 2), "low/0", "low", 2)
    snap = cell([m1], [job("x", cpu=2), job("low", cpu=2), job("hi", cpu=1, precedence=5),
                       job("j", cpu=3)])
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)),
                                             Claim("j", 0, "m1")), TxnMode.GANG),
                 staging_gang="g1")
    assert not d.rejected, d.rejected
    allocs = d.machines["m1"].allocations
    assert allocs["low/0"].evicted_by == "g1" and allocs["j/0"].gang == "g1"


def test_a_staged_gangs_own_eviction_lifts_the_victims_rules() -> None:
    """k allows one task per machine; the gang evicts k/0 and places k/1 on m1."""
    one = Constraints(max_per_machine=1)
    m1 = running(machine("m1", cpu=8), "k/0", "k", 1)
    snap = cell([m1], [job("k", tasks=2, cpu=1, constraints=one),
                       job("hi", cpu=1, precedence=5)])
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("k/0",)),
                                             Claim("k", 1, "m1")), TxnMode.GANG),
                 staging_gang="g1")
    assert not d.rejected, d.rejected


# -- an affinity group's first claim founds it ------------------------------------------


def test_the_first_claim_of_a_whole_self_affine_job_founds_its_group() -> None:
    together = Constraints(affinity=(Requirement("app", SelectorOp.IN, ("grp",)),))
    grp = job("grp", tasks=2, cpu=1, labels=[("app", "grp")], constraints=together)
    snap = cell([machine("m1", cpu=8), machine("m2", cpu=8)], [grp])
    d = validate(snap, Transaction("batch", (Claim("grp", 0, "m1"), Claim("grp", 1, "m1"))))
    assert [c.task for c in d.accepted] == ["grp/0", "grp/1"], d.rejected
    # Without the first claim the second has no group to join.
    d = validate(snap, Transaction("batch", (Claim("grp", 1, "m1"),)))
    assert [r.reason for r in d.rejected] == [Reason.CONSTRAINT_VIOLATED]
    # And the group stays together: a second claim elsewhere is refused.
    d = validate(snap, Transaction("batch", (Claim("grp", 0, "m1"), Claim("grp", 1, "m2"))))
    assert [(r.claim.task, r.reason) for r in d.rejected] == [
        ("grp/1", Reason.CONSTRAINT_VIOLATED)]


# -- resource limits ----------------------------------------------------------------------


def _limited(cpu: float, used: Resources | None) -> tuple[CellConfig, list[UsageRecord]]:
    config = CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=cpu))}, 50)
    return config, [] if used is None else [UsageRecord("batch", 50, used, 60)]


def test_claims_of_one_transaction_count_against_the_limit_together() -> None:
    config, usage = _limited(3, Resources.of(cpu=1))
    snap = cell([machine("m1", cpu=8)], [job("j", tasks=3, cpu=1)], config=config, usage=usage)
    d = validate(snap, Transaction("batch", tuple(Claim("j", i, "m1") for i in range(3))))
    assert [c.task for c in d.accepted] == ["j/0", "j/1"]
    assert [(r.claim.task, r.reason, r.detail, r.dimension) for r in d.rejected] == [
        ("j/2", Reason.LIMIT_EXCEEDED,
         "scheduler 'batch' holds 3 cpu; this task would take it past its limit of 3", "cpu")]


def test_a_limited_scheduler_without_a_usage_count_is_told_to_retry() -> None:
    config, usage = _limited(3, None)
    snap = cell([machine("m1", cpu=8)], [job("j", cpu=1)], config=config, usage=usage)
    claim = Claim("j", 0, "m1")
    d = validate(snap, Transaction("batch", (claim,)))
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (claim, Reason.LIMIT_EXCEEDED, "usage of scheduler 'batch' is not known yet; retry")]
    assert d.reads.usage == {"batch"}


def test_a_limit_of_zero_in_a_dimension_is_a_limit() -> None:
    """A config that gives a scheduler 0 cpu (as an operator writes it) lets it take no
    cpu at all; it used to read as "cpu not limited", since resources drop zeros."""
    config = codec.parse_config({"limits": {"batch": {"max_resources": {"cpu": 0, "mem": 8}}}},
                                revision=50)
    usage = [UsageRecord("batch", 50, Resources(), 60)]
    snap = cell([machine("m1", cpu=8)], [job("j", cpu=1, mem=1)], config=config, usage=usage)
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1"),)))
    assert [(r.reason, r.detail) for r in d.rejected] == [
        (Reason.LIMIT_EXCEEDED,
         "scheduler 'batch' holds 0 cpu; this task would take it past its limit of 0")]
    blocker = admission.limit_blocker(snap, snap.jobs["j"])
    assert blocker is not None and blocker.permanent
    assert blocker.text == "one task needs 1 cpu, above scheduler 'batch''s limit of 0"
    assert codec.decode_config(codec.encode_config(config), 50).limits == config.limits


def test_a_job_at_the_schedulers_precedence_limit_is_allowed() -> None:
    snap = cell([machine("m1")], [job("j", precedence=4)],
                config=CellConfig({"batch": SchedulerLimits(max_precedence=4)}))
    assert not validate(snap, Transaction("batch", (Claim("j", 0, "m1"),))).rejected


# -- claims that name their resources, fallbacks, gangs ------------------------------------


def test_a_claim_naming_other_resources_than_its_jobs_is_refused() -> None:
    snap = cell([machine("m1")], [job("j", tasks=2, cpu=1)])
    same = Claim("j", 0, "m1", resources=Resources.of(cpu=1, mem=1))
    other = Claim("j", 1, "m1", resources=Resources.of(cpu=2))
    d = validate(snap, Transaction("batch", (same, other)))
    assert [c.task for c in d.accepted] == ["j/0"]
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (other, Reason.INVALID, "claim asks for cpu=2, but job 'j' tasks need cpu=1,mem=1")]


def test_a_claim_whose_machines_all_fail_lists_each_ones_reason() -> None:
    full = running(machine("m1", cpu=1), "x/0", "x", 1)
    snap = cell([full, attrs.evolve(machine("m2"), state=MachineState.DOWN)],
                [job("x"), job("j", cpu=1)])
    claim = Claim("j", 0, "m1", fallbacks=(Fallback("m2"), Fallback("m9")))
    (r,) = validate(snap, Transaction("batch", (claim,))).rejected
    assert (r.claim, r.reason, r.detail) == (
        claim, Reason.INSUFFICIENT_RESOURCES,
        "machine 'm1' has 0 cpu free, task needs 1; fallbacks: machine 'm2' is down; "
        "unknown machine 'm9'")


def test_a_gang_jobs_claim_in_an_incremental_transaction_is_refused_on_the_jobs_record() -> None:
    snap = cell([machine("m1")], [job("g", tasks=2, gang=True)])
    claim = Claim("g", 0, "m1")
    d = validate(snap, Transaction("batch", (claim,)))
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (claim, Reason.INVALID, "job 'g' is a gang: its tasks are claimed all together in a "
                                "gang transaction, not an incremental one")]
    assert d.reads.jobs == {"g"}


def test_each_gang_job_of_a_transaction_must_be_claimed_whole() -> None:
    """Two gang jobs in one gang transaction: the first is claimed whole, the second is
    not, and the second's rule still applies."""
    snap = cell([machine("m1", cpu=8)], [job("a", tasks=2, gang=True),
                                         job("b", tasks=2, gang=True)])
    d = validate(snap, Transaction("batch", (Claim("a", 0, "m1"), Claim("a", 1, "m1"),
                                             Claim("b", 0, "m1")), TxnMode.GANG))
    assert [(r.claim.task, r.reason) for r in d.rejected] == [
        ("a/0", Reason.GANG_ABORTED), ("a/1", Reason.GANG_ABORTED), ("b/0", Reason.INVALID)]


def test_an_aborted_gang_writes_nothing_and_says_which_claim_failed_first() -> None:
    snap = cell([machine("m1", cpu=8)], [job("j", tasks=4)])
    claims = (Claim("j", 0, "m1"), Claim("j", 1, "m9"), Claim("j", 2, "m1"), Claim("j", 3, "m8"))
    d = validate(snap, Transaction("batch", claims, TxnMode.GANG))
    aborted = "gang aborted: 2 claim(s) failed, first j/1: unknown machine 'm9'"
    assert d.rejection_of("j/2").detail == aborted
    assert d.rejection_of("j/3").reason is Reason.UNKNOWN_MACHINE
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (claims[0], Reason.GANG_ABORTED, aborted),
        (claims[1], Reason.UNKNOWN_MACHINE, "unknown machine 'm9'"),
        (claims[2], Reason.GANG_ABORTED, aborted),
        (claims[3], Reason.UNKNOWN_MACHINE, "unknown machine 'm8'")]
    assert (d.accepted, d.machines, d.tasks, d.evicted, d.added, d.removed) == (
        (), {}, {}, (), {}, {})
    # What the decision read still guards it: the cell might let the gang pass later.
    assert d.reads.machines == {"m1", "m8", "m9"} and d.reads.jobs == {"j"}
    assert d.claim_machines == {"j/0": {"m1"}, "j/1": {"m9"}, "j/2": {"m1"}, "j/3": {"m8"}}


def test_a_part_of_a_split_transaction_founds_the_groups_it_is_told_to() -> None:
    """The store validates parts of a gang it split with the founders of the whole
    transaction: a part holding only grp/0 founds the group if told so, and not else."""
    together = Constraints(affinity=(Requirement("app", SelectorOp.IN, ("grp",)),))
    grp = job("grp", tasks=2, cpu=1, labels=[("app", "grp")], constraints=together)
    snap = cell([machine("m1", cpu=8)], [grp])
    part = Transaction("batch", (Claim("grp", 0, "m1"),))
    assert not validate(snap, part, founders=frozenset({"grp/0"})).rejected
    assert [r.reason for r in validate(snap, part, founders=frozenset()).rejected] == [
        Reason.CONSTRAINT_VIOLATED]
    whole = Transaction("batch", (Claim("grp", 0, "m1"), Claim("grp", 1, "m1")))
    assert len(validate(snap, whole, founders=frozenset()).rejected) == 2
