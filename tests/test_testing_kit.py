"""The testing kit plugin authors get with the package (schedulers.testing): builders,
the virtual-clock harness, and the committer that records and rejects on demand."""

from __future__ import annotations

import pytest

from cellstate.invariants import placed_tasks_of, violations
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Constraints,
    Detection,
    JobKind,
    JobState,
    MachineState,
    ModelError,
    Reason,
    Requirement,
    Resources,
    SelectorOp,
)
from cellstate.replica import Replica
from cellstate.store import CellStore
from cellstate.validation import TransactionError
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.testing import (
    CellBuilder,
    Harness,
    JobBuilder,
    MachineBuilder,
    RecordingCommitter,
    claims,
    job,
    machine,
    settled,
    txn,
)

# -- builders ------------------------------------------------------------------------------


def test_machine_builder_sets_what_it_is_told_and_defaults_the_rest() -> None:
    m = (MachineBuilder("m0").cpu(8).resource("gpu", 2).rack("r1").domain("fd1")
         .label("zone", "b").label("disk", "ssd").down().build())
    assert m.capacity == Resources.of(cpu=8, mem=16, gpu=2)
    assert (m.rack, m.failure_domain, m.state) == ("r1", "fd1", MachineState.DOWN)
    assert m.labels == (("disk", "ssd"), ("zone", "b"))
    assert MachineBuilder("m1").build() == machine("m1") == machine("m1", cpu=4, mem=16)


def test_job_builder_sets_every_field_it_names() -> None:
    j = (JobBuilder("web").tasks(3).cpu(2).mem(4).scheduler("svc").owner("ann").service()
         .precedence(7).gang().detection(Detection.COARSE).label("app", "web")
         .duration(60).submitted_at(5).spread(2).on_machines_with("disk", "ssd")
         .away_from("app", "noisy").next_to("tier").build())
    assert (j.id, j.task_count, j.scheduler, j.owner, j.kind) == ("web", 3, "svc", "ann",
                                                                  JobKind.SERVICE)
    assert j.task_resources == Resources.of(cpu=2, mem=4)
    assert (j.precedence, j.gang, j.detection, j.duration, j.submitted_at) == (
        7, True, Detection.COARSE, 60, 5)
    assert j.labels == (("app", "web"),)
    assert j.constraints == Constraints(
        machine_selector=(Requirement("disk", SelectorOp.IN, ("ssd",)),),
        anti_affinity=(Requirement("app", SelectorOp.IN, ("noisy",)),),
        affinity=(Requirement("tier", SelectorOp.EXISTS),),
        max_per_machine=2)
    assert JobBuilder("j").tasks(2).build() == job("j", tasks=2)


def test_a_builder_names_the_record_with_a_bad_amount() -> None:
    with pytest.raises(ModelError, match=r"job web task resources\.cpu"):
        JobBuilder("web").cpu(-1).build()
    with pytest.raises(ModelError, match="'GPU' is not a valid dimension name"):
        MachineBuilder("m0").resource("GPU", 1).build()


def test_cell_builder_writes_machines_then_jobs_through_the_store() -> None:
    kv = MemoryKV()
    store = CellBuilder().machines(MachineBuilder("m0"), machine("m1")).jobs(
        JobBuilder("a").tasks(2), job("b")).build(kv)
    snap = store.read_snapshot()
    assert sorted(snap.machines) == ["m0", "m1"] and sorted(snap.jobs) == ["a", "b"]


# -- the committer -------------------------------------------------------------------------


def cell() -> tuple[CellStore, RecordingCommitter]:
    kv = MemoryKV()
    admin = CellBuilder().machines(machine("m0"), machine("m1")).jobs(
        job("j", tasks=4), job("g", tasks=2, gang=True)).build(kv)
    return admin, RecordingCommitter(CellStore(kv))


def test_committer_passes_through_to_the_real_store_and_records_it() -> None:
    admin, c = cell()
    t = txn(claims(admin.read_snapshot(), "j", [(0, "m0"), (1, "m1")]))
    res = c.commit(t)
    assert res.ok and len(res.committed) == 2
    assert placed_tasks_of(admin.read_snapshot(), "j") == 2
    assert c.transactions == [t] and c.results == [res] and c.log[0].injected == ()


def test_reject_next_rejects_whole_transactions_and_writes_nothing() -> None:
    admin, c = cell()
    c.reject_next(2, Reason.INSUFFICIENT_RESOURCES, "no room today")
    before = admin.read_snapshot()
    t = txn(claims(before, "j", [(0, "m0"), (1, "m1")]))
    for _ in range(2):
        res = c.commit(t)
        assert res.committed == ()
        assert [(r.claim.task, r.reason, r.detail) for r in res.rejected] == [
            ("j/0", Reason.INSUFFICIENT_RESOURCES, "no room today"),
            ("j/1", Reason.INSUFFICIENT_RESOURCES, "no room today")]
    assert admin.read_snapshot().revision == before.revision  # nothing written
    assert c.commit(t).ok  # the third goes through
    assert [len(r.injected) for r in c.log] == [2, 2, 0]


def test_reject_machines_rejects_only_their_claims_of_an_incremental_transaction() -> None:
    admin, c = cell()
    c.reject_machines(["m0"], Reason.MACHINE_DOWN)
    t = txn(claims(admin.read_snapshot(), "j", [(0, "m0"), (1, "m1"), (2, "m0"), (3, "m1")]))
    res = c.commit(t)
    assert [cl.task for cl in res.committed] == ["j/1", "j/3"]
    assert [(r.claim.task, r.reason) for r in res.rejected] == [
        ("j/0", Reason.MACHINE_DOWN), ("j/2", Reason.MACHINE_DOWN)]
    snap = admin.read_snapshot()
    assert placed_tasks_of(snap, "j") == 2 and res.revision == snap.revision
    assert not snap.machines["m0"].allocations
    again = c.commit(txn(claims(snap, "j", [(0, "m0")])))  # still in force
    assert again.reasons() == {"j/0": Reason.MACHINE_DOWN}
    c.accept_all()
    assert c.commit(txn(claims(snap, "j", [(0, "m0")]))).ok


def test_a_gang_with_a_rejected_claim_aborts_whole() -> None:
    admin, c = cell()
    c.reject_machines(["m1"], Reason.SEQUENCE_CHANGED, times=1)
    t = txn(claims(admin.read_snapshot(), "g", [(0, "m0"), (1, "m1")]), gang=True)
    res = c.commit(t)
    assert res.reasons() == {"g/0": Reason.GANG_ABORTED, "g/1": Reason.SEQUENCE_CHANGED}
    assert placed_tasks_of(admin.read_snapshot(), "g") == 0
    assert c.commit(t).ok  # times=1: used up


def test_a_rule_counts_only_transactions_it_touched() -> None:
    admin, c = cell()
    c.reject_machines(["m1"], times=1)
    snap = admin.read_snapshot()
    assert c.commit(txn(claims(snap, "j", [(0, "m0")]))).ok  # not on m1: rule kept
    assert not c.commit(txn(claims(snap, "j", [(1, "m1")]))).ok
    assert c.commit(txn(claims(snap, "j", [(1, "m1")]))).ok


def test_a_malformed_transaction_is_refused_and_recorded_without_using_a_rule() -> None:
    admin, c = cell()
    c.reject_next(1)
    dup = claims(admin.read_snapshot(), "j", [(0, "m0"), (0, "m1")])
    with pytest.raises(TransactionError, match="already claimed"):
        c.commit(txn(dup))
    assert c.log[0].result is None and "already claimed" in c.log[0].error
    assert not c.commit(txn(dup[:1])).ok  # the rule is still pending


def test_bad_requests_to_the_committer_say_what_is_wrong() -> None:
    _, c = cell()
    with pytest.raises(ValueError, match="count must be a positive whole number, not 0"):
        c.reject_next(0)
    with pytest.raises(ValueError, match="name at least one machine"):
        c.reject_machines([])
    with pytest.raises(TypeError, match=r"reason must be a cellstate\.model\.Reason"):
        c.reject_next(1, "sequence_changed")  # type: ignore[arg-type]


# -- the harness, with the committer under the runtime --------------------------------------


def test_a_rejected_commit_sends_the_runtime_down_its_retry_path() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=8)])
    inst = h.add(BatchPolicy())
    h.committer(inst).reject_next(1)
    h.submit([job("j", tasks=3)])
    start = h.clock()
    h.run(settled)
    log = h.committer(inst).log
    assert [len(r.injected) for r in log] == [3, 0]
    assert h.machines_of("j") == ["m0"] * 3
    m = inst.metrics.summary(h.clock())
    assert (m["conflicted"], m["successful"]) == (1, 1)
    assert h.clock() - start >= RuntimeConfig().retry_delay  # retried after the backoff
    assert violations(h.snapshot()) == []


def test_a_machine_that_always_refuses_makes_the_job_give_up_with_the_reason() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0")])
    inst = h.add(BatchPolicy(), config=RuntimeConfig(max_fruitless_attempts=3))
    h.committer(inst).reject_machines(["m0"], Reason.MACHINE_DOWN, "pulled for repair")
    h.submit([job("j")])
    h.run(settled)
    status = h.snapshot().statuses["j"]
    assert status.state is JobState.ABANDONED
    assert status.reason.endswith("last conflict: machine_down: pulled for repair")
    assert len(h.committer(inst).log) == 3


def test_harness_reports_a_run_that_never_ends_and_a_foreign_committer() -> None:
    h = Harness()
    h.add(BatchPolicy())
    h.submit([job("j")])  # no machines: never placed
    with pytest.raises(AssertionError, match="not done after 5 steps"):
        h.run(lambda snap: False, max_steps=5)
    assert h.machines_of("j") == [""]
    replica = Replica(h.kv, clock=h.clock)
    replica.load()
    other = SchedulerInstance(BatchPolicy(), CellStore(h.kv), replica, instance="1",
                              clock=h.clock)
    h.attach(other, replica)
    with pytest.raises(TypeError, match="batch/1 commits through CellStore"):
        h.committer(other)
