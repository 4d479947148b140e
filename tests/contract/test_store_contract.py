"""The store's transaction contract, run unchanged against etcd and the memory backend."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest

from cellstate.cell import task_view
from cellstate.invariants import placed_tasks_of, violations
from cellstate.kv.base import KV
from cellstate.model import (
    CellConfig,
    Claim,
    Constraints,
    Job,
    JobState,
    JobStatus,
    MachineState,
    ModelError,
    Reason,
    Requirement,
    Resources,
    SchedulerLimits,
    SelectorOp,
    TaskState,
    Transaction,
    TxnMode,
    printable,
)
from cellstate.store import AlreadyExistsError, CellStore, NotFoundError, StoreError
from cellstate.validation import TransactionError
from schedulers.testing import claims, job, machine, make_cell, txn


def test_incremental_commit_places_tasks_and_bumps_sequence_numbers(kv: KV) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=3)])
    snap = store.read_snapshot()
    res = store.commit(txn(claims(snap, "j", [(0, "m1"), (1, "m1"), (2, "m2")])))
    assert res.ok and len(res.committed) == 3
    after = store.read_snapshot()
    assert after.machines["m1"].seq == after.machines["m2"].seq == res.revision
    assert after.machines["m1"].seq != snap.machines["m1"].seq
    assert {t: task_view(after, t).machine for t in ("j/0", "j/1", "j/2")} == {
        "j/0": "m1", "j/1": "m1", "j/2": "m2"}
    assert violations(after) == []


def test_claims_in_one_transaction_count_against_each_other(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=2)], [job("j", tasks=3)])
    snap = store.read_snapshot()
    res = store.commit(txn(claims(snap, "j", [(0, "m1"), (1, "m1"), (2, "m1")])))
    assert [c.index for c in res.committed] == [0, 1]
    (rej,) = res.rejected
    assert rej.claim.index == 2
    assert rej.reason is Reason.INSUFFICIENT_RESOURCES and rej.dimension == "cpu"


def _two_schedulers(kv: KV) -> tuple[CellStore, CellStore]:
    a = make_cell(kv, [machine("m1", cpu=4)], [job("a", cpu=3), job("b", cpu=3, scheduler="svc"),
                                               job("c", cpu=1, scheduler="svc")])
    return a, CellStore(kv)


def test_fine_grained_rejects_only_what_no_longer_fits(kv: KV) -> None:
    a, b = _two_schedulers(kv)
    snap = a.read_snapshot()  # both schedulers decide on the same snapshot
    assert a.commit(txn(claims(snap, "a", [(0, "m1")]))).ok
    lost = b.commit(txn(claims(snap, "b", [(0, "m1")]), scheduler="svc"))
    assert lost.rejected[0].reason is Reason.INSUFFICIENT_RESOURCES
    fits = b.commit(txn(claims(snap, "c", [(0, "m1")]), scheduler="svc"))
    assert fits.ok  # the machine changed, but the claim still fits
    assert violations(a.read_snapshot()) == []


def test_coarse_grained_rejects_any_claim_on_a_changed_machine(kv: KV) -> None:
    a, b = _two_schedulers(kv)
    snap = a.read_snapshot()
    assert a.commit(txn(claims(snap, "a", [(0, "m1")]), coarse=True)).ok
    res = b.commit(txn(claims(snap, "c", [(0, "m1")]), scheduler="svc", coarse=True))
    (rej,) = res.rejected
    assert rej.reason is Reason.SEQUENCE_CHANGED
    fresh = b.read_snapshot()
    assert b.commit(txn(claims(fresh, "c", [(0, "m1")]), scheduler="svc", coarse=True)).ok


def test_gang_commits_all_or_nothing(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=2), machine("m2", cpu=1)], [job("g", tasks=3)])
    snap = store.read_snapshot()
    before = snap.revision
    res = store.commit(txn(claims(snap, "g", [(0, "m1"), (1, "m2"), (2, "m2")]), gang=True))
    assert res.committed == ()
    reasons = [r.reason for r in res.rejected]
    assert reasons == [Reason.GANG_ABORTED, Reason.GANG_ABORTED, Reason.INSUFFICIENT_RESOURCES]
    assert store.read_snapshot().revision == before
    ok = store.commit(txn(claims(snap, "g", [(0, "m1"), (1, "m1"), (2, "m2")]), gang=True))
    assert ok.ok and placed_tasks_of(store.read_snapshot(), "g") == 3


def test_eviction_needs_lower_precedence(kv: KV) -> None:
    store = make_cell(
        kv,
        [machine("m1", cpu=2)],
        [job("low", cpu=2, precedence=1), job("same", cpu=2, precedence=1, scheduler="svc"),
         job("high", cpu=2, precedence=5, scheduler="svc")],
    )
    snap = store.read_snapshot()
    assert store.commit(txn(claims(snap, "low", [(0, "m1")]))).ok
    snap = store.read_snapshot()
    same = Claim("same", 0, "m1", snap.machines["m1"].seq, evict=("low/0",))
    res = store.commit(Transaction("svc", (same,)))
    assert res.rejected[0].reason is Reason.PRECEDENCE_TOO_LOW
    high = Claim("high", 0, "m1", snap.machines["m1"].seq, evict=("low/0",))
    res = store.commit(Transaction("svc", (high,)))
    assert res.ok and res.evicted == ("low/0",)
    after = store.read_snapshot()
    assert task_view(after, "low/0").state is TaskState.PREEMPTED
    assert task_view(after, "high/0").state is TaskState.RUNNING
    assert violations(after) == []
    # A preempted task can be placed again.
    store.add_machine(machine("m2", cpu=2))
    again = store.commit(txn(claims(store.read_snapshot(), "low", [(0, "m2")])))
    assert again.ok


def test_a_scheduler_reorders_its_own_work_at_one_precedence(kv: KV) -> None:
    store = make_cell(
        kv,
        [machine("m1", cpu=2)],
        [job("first", cpu=2, precedence=1), job("second", cpu=2, precedence=1),
         job("theirs", cpu=2, precedence=1, scheduler="svc")],
    )
    assert store.commit(txn(claims(store.read_snapshot(), "first", [(0, "m1")]))).ok
    snap = store.read_snapshot()
    # Another scheduler may not take the task at its own precedence ...
    theirs = Claim("theirs", 0, "m1", snap.machines["m1"].seq, evict=("first/0",))
    res = store.commit(Transaction("svc", (theirs,)))
    assert res.rejected[0].reason is Reason.PRECEDENCE_TOO_LOW
    assert store.read_snapshot().revision == snap.revision
    # ... the scheduler that placed it may.
    second = Claim("second", 0, "m1", snap.machines["m1"].seq, evict=("first/0",))
    res = store.commit(txn((second,)))
    assert res.ok and res.evicted == ("first/0",)
    after = store.read_snapshot()
    assert task_view(after, "first/0").state is TaskState.PREEMPTED
    assert violations(after) == []


def test_rejection_reasons_name_the_problem(kv: KV) -> None:
    store = make_cell(
        kv,
        [machine("m1", labels=(("ssd", "yes"),)), machine("m2"),
         machine("down", state=MachineState.DOWN)],
        [
            job("j", tasks=3),
            job("picky", constraints=Constraints(machine_selector=(
                Requirement("ssd", SelectorOp.IN, ("yes",)),))),
            job("spread", tasks=2, constraints=Constraints(max_per_machine=1)),
            job("other", scheduler="svc"),
        ],
    )
    snap = store.read_snapshot()
    res = store.commit(txn([
        Claim("j", 0, "nowhere"),
        Claim("j", 1, "down", snap.machines["down"].seq),
        Claim("picky", 0, "m2"),
        Claim("spread", 0, "m2"),
        Claim("spread", 1, "m2"),
        Claim("other", 0, "m1"),
        Claim("j", 7, "m1"),
        Claim("ghost", 0, "m1"),
    ]))
    reasons = {(r.claim.job, r.claim.index): (r.reason, r.detail) for r in res.rejected}
    assert reasons[("j", 0)][0] is Reason.UNKNOWN_MACHINE and "nowhere" in reasons[("j", 0)][1]
    assert reasons[("j", 1)][0] is Reason.MACHINE_DOWN
    assert reasons[("picky", 0)][0] is Reason.CONSTRAINT_VIOLATED
    assert reasons[("spread", 1)][0] is Reason.CONSTRAINT_VIOLATED
    assert reasons[("other", 0)][0] is Reason.INVALID and "svc" in reasons[("other", 0)][1]
    assert reasons[("j", 7)][0] is Reason.INVALID and "no task 7" in reasons[("j", 7)][1]
    assert reasons[("ghost", 0)][0] is Reason.INVALID and "unknown job" in reasons[("ghost", 0)][1]
    assert [(c.job, c.index) for c in res.committed] == [("spread", 0)]
    placed = store.commit(txn([Claim("j", 2, "m1")]))
    assert placed.ok
    twice = store.commit(txn([Claim("j", 2, "m2")]))
    assert twice.rejected[0].reason is Reason.TASK_ALREADY_PLACED


def test_anti_affinity_and_affinity(kv: KV) -> None:
    store = make_cell(
        kv,
        [machine("m1"), machine("m2")],
        [
            job("db", labels=[("app", "db")]),
            job("noisy", constraints=Constraints(anti_affinity=(
                Requirement("app", SelectorOp.IN, ("db",)),))),
            job("cache", constraints=Constraints(affinity=(
                Requirement("app", SelectorOp.IN, ("db",)),))),
        ],
    )
    assert store.commit(txn([Claim("db", 0, "m1")])).ok
    res = store.commit(txn([Claim("noisy", 0, "m1"), Claim("cache", 0, "m2")]))
    assert [r.reason for r in res.rejected] == [Reason.CONSTRAINT_VIOLATED] * 2
    assert store.commit(txn([Claim("noisy", 0, "m2"), Claim("cache", 0, "m1")])).ok


APP_T1 = (Requirement("app", SelectorOp.IN, ("t1",)),)


def _affinity_group(tasks: int = 2, gang: bool = True, cpu: float = 1) -> Job:
    return job("t1", tasks=tasks, cpu=cpu, labels=[("app", "t1")], gang=gang,
               constraints=Constraints(affinity=APP_T1))


def test_a_transaction_claiming_a_whole_affinity_group_founds_it(kv: KV) -> None:
    """A job whose labels match its own affinity: its first task could never meet the
    rule "the machine runs a matching task"; a transaction claiming every task of it
    founds the group with its first claim, and the others must join that machine."""
    store = make_cell(kv, [machine("m1", cpu=4), machine("m2", cpu=4)],
                      [_affinity_group(3), job("solo", labels=[("app", "t1")],
                                              constraints=Constraints(affinity=APP_T1))])
    split = store.commit(txn(claims(store.read_snapshot(), "t1", [(0, "m1"), (1, "m1"),
                                                                    (2, "m2")]), gang=True))
    assert [r.reason for r in split.rejected] == [
        Reason.GANG_ABORTED, Reason.GANG_ABORTED, Reason.CONSTRAINT_VIOLATED]
    assert "affinity" in split.rejected[2].detail
    whole = store.commit(txn(claims(store.read_snapshot(), "t1", [(0, "m2"), (1, "m2"),
                                                                    (2, "m2")]), gang=True))
    assert whole.ok
    after = store.read_snapshot()
    assert [task_view(after, f"t1/{i}").machine for i in range(3)] == ["m2"] * 3
    # A one-task job matching its own rule claims all of itself: it founds a group
    # too; it may also join the running one.
    assert store.commit(txn([Claim("solo", 0, "m1")])).ok
    assert violations(store.read_snapshot()) == []


def test_a_partial_claim_of_an_affinity_group_founds_nothing(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=4)], [_affinity_group(3, gang=False)])
    res = store.commit(txn([Claim("t1", 0, "m1"), Claim("t1", 1, "m1")]))
    assert [r.reason for r in res.rejected] == [Reason.CONSTRAINT_VIOLATED] * 2
    # Founded by a whole claim, a lost task later rejoins its group's machine only.
    assert store.commit(txn([Claim("t1", i, "m1") for i in range(3)])).ok


def test_a_large_gang_founds_its_affinity_group(kv: KV) -> None:
    """A gang too large for one etcd transaction (the memory backend's limit) is
    validated in parts: the founding claim is the whole transaction's first, whichever
    part it falls in."""
    store = make_cell(kv, [machine("big", cpu=400, mem=400)],
                      [_affinity_group(100, cpu=1)])
    res = store.commit(txn([Claim("t1", i, "big") for i in range(100)], gang=True))
    assert res.ok and len(res.committed) == 100
    assert violations(store.read_snapshot()) == []


def test_precedence_limit_per_scheduler(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("vip", precedence=9)])
    store.set_config(CellConfig({"batch": SchedulerLimits(max_precedence=5)}))
    res = store.commit(txn([Claim("vip", 0, "m1")]))
    assert res.rejected[0].reason is Reason.LIMIT_EXCEEDED


def test_resource_limit_per_scheduler_counts_across_commits_and_releases(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=8), machine("m2", cpu=8)], [job("j", tasks=6, cpu=1)])
    assert store.commit(txn([Claim("j", 0, "m1")])).ok  # held before the limit was set
    store.set_config(CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=3))}))
    res = store.commit(txn([Claim("j", i, f"m{1 + i % 2}") for i in range(1, 5)]))
    assert [c.index for c in res.committed] == [1, 2]
    assert {r.reason for r in res.rejected} == {Reason.LIMIT_EXCEEDED}
    assert res.rejected[0].dimension == "cpu"
    store.release_task("j/0", TaskState.FINISHED)
    other = CellStore(kv)  # a second committer sees the same counter
    assert other.commit(txn([Claim("j", 3, "m2")])).ok
    assert other.commit(txn([Claim("j", 4, "m2")])).rejected[0].reason is Reason.LIMIT_EXCEEDED
    assert violations(store.read_snapshot()) == []


def test_release_frees_resources_and_records_the_outcome(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=1)], [job("a"), job("b")])
    assert store.commit(txn([Claim("a", 0, "m1")])).ok
    assert store.commit(txn([Claim("b", 0, "m1")])).rejected[0].reason is (
        Reason.INSUFFICIENT_RESOURCES)
    store.release_task("a/0", TaskState.FINISHED)
    assert task_view(store.read_snapshot(), "a/0").state is TaskState.FINISHED
    assert store.commit(txn([Claim("b", 0, "m1")])).ok
    with pytest.raises(StoreError, match="finished, not running"):
        store.release_task("a/0", TaskState.FAILED)


def test_machine_down_loses_its_tasks_which_can_be_placed_again(kv: KV) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=2)])
    assert store.commit(txn([Claim("j", 0, "m1"), Claim("j", 1, "m1")])).ok
    store.update_machine("m1", state=MachineState.DOWN)
    snap = store.read_snapshot()
    assert {task_view(snap, f"j/{i}").state for i in range(2)} == {TaskState.LOST}
    assert snap.machines["m1"].allocations == {}
    assert store.commit(txn([Claim("j", 0, "m2"), Claim("j", 1, "m1")])).rejected[0].reason is (
        Reason.MACHINE_DOWN)
    assert task_view(store.read_snapshot(), "j/0").state is TaskState.RUNNING
    store.remove_machine("m1")
    assert "m1" not in store.read_snapshot().machines
    assert violations(store.read_snapshot()) == []


def test_machine_and_job_operations_refuse_bad_requests(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=2)], [job("j", cpu=2)])
    with pytest.raises(AlreadyExistsError):
        store.add_machine(machine("m1"))
    with pytest.raises(AlreadyExistsError):
        store.submit_job(job("j"))
    with pytest.raises(NotFoundError):
        store.update_machine("nope", state=MachineState.DOWN)
    assert store.commit(txn([Claim("j", 0, "m1")])).ok
    before = store.read_snapshot().revision
    with pytest.raises(StoreError, match="below the 2 its tasks hold"):
        store.update_machine("m1", capacity=Resources.of(cpu=1, mem=16))
    assert store.read_snapshot().revision == before
    store.update_machine("m1", capacity=Resources.of(cpu=4, mem=16))
    assert store.read_snapshot().machines["m1"].capacity.get("cpu") == 4


# -- bad input leaves the store exactly as it was ------------------------------------


@pytest.mark.parametrize(("status", "error"), [
    (JobStatus("j", JobState.KILLED, "stop\x1b[2Jnow"),
     "status reason holds control character '\\x1b' at position 4"),
    (JobStatus("j", JobState.KILLED, "x" * 1001),
     "status reason has 1001 characters, more than the limit of 1000"),
    (JobStatus("j", JobState.ABANDONED, "gave up", by="b\ni0"),
     "status by holds control character '\\n' at position 1"),
    (JobStatus("j", JobState.ABANDONED, "gave up", at=float("nan")),
     "status time nan is not a finite, non-negative number"),
    (JobStatus("j", JobState.KILLED, "why", at=-1.0),
     "status time -1.0 is not a finite, non-negative number"),
])
def test_a_status_with_bad_text_or_time_is_refused(kv: KV, status: JobStatus, error: str
                                                   ) -> None:
    """A status's reason and author are shown in terminals: bounded, no control
    characters (an escape sequence could rewrite an operator's screen)."""
    store = make_cell(kv, [machine("m1", cpu=2)], [job("j", cpu=1)])
    assert store.commit(txn([Claim("j", 0, "m1")])).ok
    before = store.read_snapshot()
    with pytest.raises(ModelError, match=re.escape(error)):
        if status.state is JobState.KILLED:
            store.kill_job(status)
        else:
            store.set_job_status(status)
    after = store.read_snapshot()
    assert after.revision == before.revision
    assert "j" not in after.statuses and after.tasks["j/0"].state is TaskState.RUNNING
    # Cut and cleaned by printable, the same text is taken.
    store.set_job_status(JobStatus("j", JobState.ABANDONED,
                                   printable(status.reason + "\x07" * 2000)))
    assert len(store.read_snapshot().statuses["j"].reason) == 1000


# Each case builds its transaction only when it runs: the oversized one is 100,001
# claims (0.3 s of CPU alone, 10-16 s per case in a whole-file run at load 8-9, where
# every case built them all).
_BAD_TRANSACTIONS: dict[str, Callable[[], Transaction]] = {
    "empty": lambda: Transaction("batch", ()),
    "oversized": lambda: Transaction("batch",
                                     tuple(Claim("j", i, "m1") for i in range(100_001))),
    "nan": lambda: Transaction("batch", (Claim("j", 0, "m1", resources=Resources(
        (("cpu", math.nan),))),)),
    "negative": lambda: Transaction("batch", (Claim("j", 0, "m1", resources=Resources(
        (("cpu", -1.0),))),)),
    "huge": lambda: Transaction("batch", (Claim("j", 0, "m1", resources=Resources(
        (("cpu", 1e300),))),)),
    "claimed twice": lambda: Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 0, "m2"))),
    "other job": lambda: Transaction("batch", (Claim("j", 0, "m1"), Claim("k", 0, "m1")),
                                     job="j"),
    "bad index": lambda: Transaction("batch", (Claim("j", -1, "m1"),)),
    "bad machine name": lambda: Transaction("batch", (Claim("j", 0, "../etc"),)),
    "evicts own claim": lambda: Transaction("batch", (Claim("j", 0, "m1", evict=("j/1",)),
                                                      Claim("j", 1, "m1"))),
    "bad scheduler": lambda: Transaction("bad name!", (Claim("j", 0, "m1"),)),
}


@pytest.mark.parametrize("case", list(_BAD_TRANSACTIONS))
def test_malformed_transaction_is_refused_and_changes_nothing(kv: KV, case: str) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=2), job("k")])
    before = store.read_snapshot()
    bad = _BAD_TRANSACTIONS[case]()
    with pytest.raises(TransactionError) as err:
        store.commit(bad)
    message = str(err.value)
    expected = {
        "empty": "no claims", "oversized": "limit of 100000", "nan": "NaN",
        "negative": "negative", "huge": "above the limit", "claimed twice": "already claimed",
        "other job": "transaction is for job 'j'", "bad index": "task index -1",
        "bad machine name": "not a valid name", "evicts own claim": "which this transaction claims",
        "bad scheduler": "scheduler 'bad name!'",
    }[case]
    assert expected in message
    after = store.read_snapshot()
    assert after.revision == before.revision
    assert dict(after.machines) == dict(before.machines)


def test_claim_with_resources_other_than_the_jobs_is_rejected(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("j", cpu=1)])
    before = store.read_snapshot().revision
    res = store.commit(txn([Claim("j", 0, "m1", resources=Resources.of(cpu=0.5, mem=1))]))
    assert res.rejected[0].reason is Reason.INVALID and "cpu=0.5" in res.rejected[0].detail
    assert store.read_snapshot().revision == before


def test_hostile_evictions_are_rejected(kv: KV) -> None:
    store = make_cell(kv, [machine("m1", cpu=1), machine("m2", cpu=1)],
                      [job("low", tasks=1), job("high", precedence=5, scheduler="svc")])
    assert store.commit(txn([Claim("low", 0, "m2")])).ok
    before = store.read_snapshot().revision
    res = store.commit(Transaction("svc", (Claim("high", 0, "m1", evict=("low/0",)),)))
    assert res.rejected[0].reason is Reason.INVALID and "does not run on" in res.rejected[0].detail
    assert store.read_snapshot().revision == before


# -- large gangs (staged protocol) ---------------------------------------------------


def test_gang_larger_than_one_etcd_txn_commits_atomically(kv: KV) -> None:
    from cellstate.replica import Replica

    n_machines, n_tasks = 60, 240
    store = make_cell(kv, [machine(f"m{i}", cpu=8) for i in range(n_machines)],
                      [job("big", tasks=n_tasks)])
    replica = Replica(kv)
    replica.load()
    seen: list[int] = []
    replica.on_change(lambda s: seen.append(placed_tasks_of(s, "big")))
    snap = store.read_snapshot()
    # Machine by machine, so m59 is staged only in the last group, whatever the
    # backend's limits make the groups.
    per = n_tasks // n_machines
    t = txn(claims(snap, "big", [(i, f"m{i // per}") for i in range(n_tasks)]), gang=True)
    res = store.commit(t)
    assert res.ok and res.attempts > 2  # it went through the staged protocol
    replica.pump(timeout=0.5)
    while replica.pump(timeout=0.2):
        pass
    assert set(seen) <= {0, n_tasks} and seen[-1] == n_tasks
    final = store.read_snapshot()
    assert final.gangs == {} or len(final.gangs) == 0
    assert all(not a.gang for m in final.machines.values() for a in m.allocations.values())
    assert violations(final) == []
    replica.stop()


def test_staged_gang_that_loses_a_race_leaves_nothing(kv: KV) -> None:
    """A rival fills a machine after the gang was validated but before its last group is
    staged: the gang aborts and every staged hold is gone."""
    n_machines, n_tasks = 60, 240
    store = make_cell(kv, [machine(f"m{i}", cpu=4) for i in range(n_machines)],
                      [job("big", tasks=n_tasks), job("rival", cpu=4, scheduler="svc")])
    rival = CellStore(kv)
    snap = store.read_snapshot()
    writes = 0
    original = store._try_write

    def racing_write(w):  # type: ignore[no-untyped-def]
        nonlocal writes
        writes += 1
        if writes == 3:  # after the gang record and the first staged group
            assert rival.commit(Transaction("svc", (Claim("rival", 0, "m59"),))).ok
        return original(w)

    store._try_write = racing_write  # type: ignore[method-assign]
    # Machine by machine, so m59 is staged only in the last group, whatever the
    # backend's limits make the groups.
    per = n_tasks // n_machines
    t = txn(claims(snap, "big", [(i, f"m{i // per}") for i in range(n_tasks)]), gang=True)
    res = store.commit(t)
    assert res.committed == ()
    assert Reason.INSUFFICIENT_RESOURCES in {r.reason for r in res.rejected}
    final = store.read_snapshot()
    assert placed_tasks_of(final, "big") == 0
    assert all(a.job == "rival" for m in final.machines.values() for a in m.allocations.values())
    assert not any(t.job == "big" for t in final.tasks.values())
    assert len(final.gangs) == 0
    assert violations(final) == []


def test_recover_settles_a_committed_gang_left_half_finalized(kv: KV) -> None:
    n_machines, n_tasks = 40, 160
    store = make_cell(kv, [machine(f"m{i}", cpu=8) for i in range(n_machines)],
                      [job("big", tasks=n_tasks)])
    snap = store.read_snapshot()
    store.finalize_gang = lambda *a, **k: None  # type: ignore[method-assign]  # "crash" here
    # Machine by machine, so m59 is staged only in the last group, whatever the
    # backend's limits make the groups.
    per = n_tasks // n_machines
    t = txn(claims(snap, "big", [(i, f"m{i // per}") for i in range(n_tasks)]), gang=True)
    assert store.commit(t).ok
    mid = store.read_snapshot()
    assert len(mid.gangs) == 1 and placed_tasks_of(mid, "big") == n_tasks
    assert violations(mid) == []
    other = CellStore(kv)
    assert len(other.recover()) == 1
    final = other.read_snapshot()
    assert len(final.gangs) == 0 and placed_tasks_of(final, "big") == n_tasks
    assert all(not a.gang for m in final.machines.values() for a in m.allocations.values())
    assert violations(final) == []


def test_staged_gang_with_evictions_preempts_only_at_the_commit_point(kv: KV) -> None:
    n = 50
    store = make_cell(
        kv, [machine(f"m{i}", cpu=2) for i in range(n)],
        [job("low", tasks=n, cpu=2, precedence=1),
         job("big", tasks=n * 2, cpu=1, precedence=5, scheduler="svc")],
    )
    assert store.commit(txn([Claim("low", i, f"m{i}") for i in range(n)])).ok
    snap = store.read_snapshot()
    cs = []
    for i in range(n):
        seq = snap.machines[f"m{i}"].seq
        cs.append(Claim("big", 2 * i, f"m{i}", seq, evict=(f"low/{i}",)))
        cs.append(Claim("big", 2 * i + 1, f"m{i}", seq))
    res = store.commit(Transaction("svc", tuple(cs), mode=TxnMode.GANG))
    assert res.ok and len(res.evicted) == n
    final = store.read_snapshot()
    assert placed_tasks_of(final, "big") == 2 * n and placed_tasks_of(final, "low") == 0
    assert {task_view(final, f"low/{i}").state for i in range(n)} == {TaskState.PREEMPTED}
    assert violations(final) == []


def test_a_gang_with_more_tasks_on_one_machine_than_one_txn_writes_settles(kv: KV) -> None:
    """Settling rewrites each of the machine's gang records: more than one etcd
    transaction can carry (it used to fail with "too many operations" after the commit
    point, leaving the gang's marks for recover())."""
    n = 2 * kv.max_txn_ops + 5
    store = make_cell(kv, [machine("m1", cpu=n + 8, mem=4 * n), machine("m2")],
                      [job("big", tasks=n)])
    snap = store.read_snapshot()
    res = store.commit(txn(claims(snap, "big", [(i, "m1") for i in range(n)]), gang=True))
    assert res.ok and len(res.committed) == n
    final = store.read_snapshot()
    assert len(final.gangs) == 0 and placed_tasks_of(final, "big") == n
    assert not any(a.gang for a in final.machines["m1"].allocations.values())
    assert violations(final) == []


def test_a_gang_evicting_more_tasks_on_one_machine_than_one_txn_writes(kv: KV) -> None:
    n = kv.max_txn_ops + 5
    store = make_cell(
        kv, [machine("m1", cpu=n, mem=4 * n)],
        [job("low", tasks=n, precedence=1),
         job("big", tasks=n, precedence=5, scheduler="svc")],
    )
    assert store.commit(txn(claims(store.read_snapshot(), "low",
                                   [(i, "m1") for i in range(n)]))).ok
    seq = store.read_snapshot().machines["m1"].seq
    cs = tuple(Claim("big", i, "m1", seq, evict=(f"low/{i}",)) for i in range(n))
    res = store.commit(Transaction("svc", cs, mode=TxnMode.GANG))
    assert res.ok and len(res.evicted) == n
    final = store.read_snapshot()
    assert placed_tasks_of(final, "big") == n and placed_tasks_of(final, "low") == 0
    assert {task_view(final, f"low/{i}").state for i in range(n)} == {TaskState.PREEMPTED}
    assert len(final.gangs) == 0 and violations(final) == []


def test_per_machine_writes_retry_only_the_machines_that_changed(kv: KV) -> None:
    from cellstate.store import StoreOptions

    admin = make_cell(kv, [machine("m1", cpu=8), machine("m2", cpu=8)], [job("j", tasks=4)])
    store = CellStore(kv, options=StoreOptions(per_machine_writes="always"))
    store.load()
    admin.commit(txn([Claim("j", 0, "m1")]))  # the store's copy of m1 is now stale
    res = store.commit(txn([Claim("j", 1, "m1"), Claim("j", 2, "m2")]))
    assert [c.index for c in res.committed] == [1, 2] and res.attempts == 2
    snap = store.read_snapshot()
    assert sorted(snap.machines["m1"].allocations) == ["j/0", "j/1"]
    assert sorted(snap.machines["m2"].allocations) == ["j/2"]
    # m2 committed at the first try; only m1 was decided and written again.
    assert snap.machines["m2"].seq < snap.machines["m1"].seq == res.revision
    assert violations(snap) == []


@pytest.mark.parametrize("per_machine", ["always", "never"])
@pytest.mark.parametrize("release", [False, True])
def test_a_stale_view_learns_added_and_released_allocations(
        kv: KV, per_machine: str, release: bool) -> None:
    """A failed guard on a machine the store holds brings back only the allocations
    changed since (with the count of all): what another committer placed there is
    added, and a release (a deleted allocation key) makes the store read the machine
    whole, so its view ends equal to etcd's either way."""
    from cellstate.store import StoreOptions

    admin = make_cell(kv, [machine("m1", cpu=4)],
                      [job("a", tasks=4), job("b", tasks=2, scheduler="svc")])
    store = CellStore(kv, options=StoreOptions(per_machine_writes=per_machine))
    assert store.commit(txn([Claim("a", 0, "m1"), Claim("a", 1, "m1")])).ok
    assert admin.commit(txn([Claim("b", 0, "m1")], scheduler="svc")).ok
    if release:
        admin.release_task("a/0", TaskState.FINISHED)
    # Fits only if the release is seen: 4 CPUs, a/1 + b/0 + a/2 (+ a/0 unless released).
    res = store.commit(txn([Claim("a", 2, "m1"), Claim("a", 3, "m1")]))
    assert [c.index for c in res.committed] == ([2, 3] if release else [2])
    assert res.attempts == 2
    fresh = store.read_snapshot().machines["m1"]
    held = store.view.machines["m1"]
    assert held.seq == fresh.seq
    assert held.allocations == fresh.allocations
    expected = {"a/1", "b/0", "a/2"} | ({"a/3"} if release else {"a/0"})
    assert set(fresh.allocations) == expected
    assert violations(store.read_snapshot()) == []


def test_a_task_placed_elsewhere_meanwhile_is_not_placed_again(kv: KV) -> None:
    """Two committers claim one task on two different machines: the machine guards both
    hold, so only the task's own guard stops the second (no compare is redundant)."""
    admin = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=2)])
    stale = CellStore(kv)
    stale.load()
    assert admin.commit(txn([Claim("j", 0, "m1")])).ok
    res = stale.commit(txn([Claim("j", 0, "m2")]))
    assert res.committed == () and res.attempts == 2
    assert res.rejected[0].reason is Reason.TASK_ALREADY_PLACED
    snap = stale.read_snapshot()
    assert task_view(snap, "j/0").machine == "m1"
    assert snap.machines["m2"].allocations == {}
    assert violations(snap) == []


def test_an_operator_write_on_a_machine_that_lost_an_allocation_meanwhile(kv: KV) -> None:
    """A store that holds a machine reads back only what changed; when an allocation
    was deleted since, it reads the machine whole before deciding, so a cordon finds
    the machine (and a drain loses exactly the tasks it holds now)."""
    admin = make_cell(kv, [machine("m1", cpu=4)],
                      [job("a", tasks=2), job("b", tasks=1, scheduler="svc")])
    store = CellStore(kv)
    assert store.commit(txn([Claim("a", 0, "m1"), Claim("a", 1, "m1")])).ok
    admin.release_task("a/0", TaskState.FINISHED)
    assert admin.commit(txn([Claim("b", 0, "m1")], scheduler="svc")).ok
    _, state, _ = store.set_machine_state("m1", "cordon")
    assert state is MachineState.CORDONED
    assert set(store.view.machines["m1"].allocations) == {"a/1", "b/0"}
    _, _, lost = store.set_machine_state("m1", "drain")
    assert lost == 2
    snap = store.read_snapshot()
    assert snap.machines["m1"].allocations == {}
    assert violations(snap) == []
