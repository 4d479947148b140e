"""Writes that race each other, forced into the losing order (issue 14, findings 1-3
and 8): a kill or a shrink against a claim decided before it, a gang job claimed in
part, a kill landing while a large gang stages, a release answered twice.

``Interleaving`` is a real backend with a hook at one chosen moment: it runs the
other party's write exactly between a store's read and its guarded write, the window
the black-box campaign hit by chance. Both backends (memory, etcd) run every test."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from cellstate import codec
from cellstate.cell import task_view
from cellstate.invariants import violations
from cellstate.kv.base import KV, Compare, Op, Put, RangeResult, TxnResult, Watcher
from cellstate.model import (
    CellConfig,
    Claim,
    JobState,
    JobStatus,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
)
from cellstate.store import CellStore, StoreError, StoreOptions
from schedulers.testing import job, machine


class Interleaving(KV):
    """A KV that runs ``hook`` once, at the first call ``after_range`` or
    ``before_txn`` picks, and otherwise passes every call to the real backend."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.max_txn_ops = kv.max_txn_ops
        self.max_request_bytes = kv.max_request_bytes
        self.after_range: Callable[[bytes, bool], bool] | None = None
        self.before_txn: Callable[[Sequence[Op]], bool] | None = None
        self.hook: Callable[[], object] = lambda: None
        self.fired = False

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self.hook()

    def range(self, key: bytes, range_end: bytes | None = None, **kw: object) -> RangeResult:
        res = self.kv.range(key, range_end, **kw)  # type: ignore[arg-type]
        if self.after_range is not None and self.after_range(key, bool(kw.get("keys_only"))):
            self._fire()
        return res

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        if self.before_txn is not None and self.before_txn(success):
            self._fire()
        return self.kv.txn(compares, success, failure)

    def watch(self, key: bytes, range_end: bytes | None = None, *,
              start_revision: int = 0) -> Watcher:
        return self.kv.watch(key, range_end, start_revision=start_revision)

    def compact(self, revision: int) -> None:
        self.kv.compact(revision)

    def lease_grant(self, ttl: int) -> int:
        return self.kv.lease_grant(ttl)

    def lease_keepalive(self, lease_id: int) -> int:
        return self.kv.lease_keepalive(lease_id)

    def lease_revoke(self, lease_id: int) -> None:
        self.kv.lease_revoke(lease_id)

    def lease_keys(self, lease_id: int) -> tuple[bytes, ...]:
        return self.kv.lease_keys(lease_id)

    def close(self) -> None:
        pass  # the fixture owns the real backend


_cells = iter(range(10**6))


@pytest.fixture
def cell() -> str:
    return f"race{next(_cells)}"


def setup(kv: KV, cell: str, *, tasks: int = 4, gang: bool = False) -> CellStore:
    admin = CellStore(kv, cell)
    admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in range(4)])
    admin.submit_job(job("j", tasks=tasks, cpu=1, scheduler="s", gang=gang))
    return admin


def running(store: CellStore, jid: str) -> list[str]:
    snap = store.read_snapshot()
    return sorted(t for t in snap.tasks if t.startswith(f"{jid}/")
                  and task_view(snap, t).state is TaskState.RUNNING)


# -- finding 1: killed jobs keep getting placed -------------------------------------


def test_a_claim_decided_before_a_kill_is_refused_after_it(kv: KV, cell: str) -> None:
    admin = setup(kv, cell)
    sched = CellStore(kv, cell)
    sched.load()  # the scheduler's view: the job is live
    admin.kill_job(JobStatus("j", JobState.KILLED, "user said so"))
    res = sched.commit(Transaction("s", (Claim("j", 0, "m0"),)))
    assert res.committed == ()
    assert res.rejected[0].reason is Reason.JOB_ENDED
    assert "killed" in res.rejected[0].detail
    assert running(admin, "j") == []


def test_kill_ends_tasks_placed_after_its_caller_last_looked(kv: KV, cell: str) -> None:
    admin = setup(kv, cell)
    admin.load()  # the killer's view is taken before the placements below
    sched = CellStore(kv, cell)
    placed = sched.commit(Transaction("s", tuple(Claim("j", i, f"m{i}") for i in range(3))))
    assert len(placed.committed) == 3
    admin.kill_job(JobStatus("j", JobState.KILLED, "user said so"))
    assert running(admin, "j") == []
    snap = admin.read_snapshot()
    # Issue 34: killed, not lost (the word for a machine's failure).
    assert {snap.tasks[f"j/{i}"].state for i in range(3)} == {TaskState.KILLED}
    assert all(not m.allocations for m in snap.machines.values())
    assert violations(snap) == []


def test_a_kill_landing_while_a_large_gang_stages_aborts_the_gang(kv: KV, cell: str) -> None:
    """The gang's placements are staged before the kill; its commit point comes after.
    The commit point reads the job's status, so the gang aborts and nothing runs."""
    tasks = 40
    admin = CellStore(kv, cell)
    admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in range(tasks)])
    admin.submit_job(job("j", tasks=tasks, cpu=1, scheduler="s", gang=True))
    hooked = Interleaving(kv)
    # Small etcd transactions force the staged protocol for 40 claims on 40 machines.
    hooked.max_txn_ops = 16
    hooked.before_txn = lambda ops: any(b'"committed"' in getattr(o, "value", b"")
                                        for o in ops)
    hooked.hook = lambda: CellStore(kv, cell).kill_job(
        JobStatus("j", JobState.KILLED, "killed mid-gang"))
    sched = CellStore(hooked, cell, options=StoreOptions(per_machine_writes="never"))
    res = sched.commit(Transaction("s", tuple(Claim("j", i, f"m{i}") for i in range(tasks)),
                                   TxnMode.GANG))
    assert hooked.fired, "the gang never reached its commit point"
    assert res.committed == ()
    assert {r.reason for r in res.rejected} <= {Reason.JOB_ENDED, Reason.GANG_ABORTED}
    assert any(r.reason is Reason.JOB_ENDED for r in res.rejected)
    admin.recover()
    assert running(admin, "j") == []
    assert violations(admin.read_snapshot()) == []


def test_a_claim_taking_the_quota_while_a_large_gang_stages_aborts_the_gang(
        kv: KV, cell: str) -> None:
    """Each part of a staged gang passes the scheduler's resource limit; another commit
    of the same scheduler lands before the gang's commit point and leaves too little.
    The commit point counts the whole gang against the limit again (the quota fit
    rule), so the gang aborts with the limit named and nothing of it runs."""
    tasks = 40
    admin = CellStore(kv, cell)
    admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in range(tasks)])
    admin.submit_job(job("j", tasks=tasks, cpu=1, scheduler="s", gang=True))
    admin.submit_job(job("k", tasks=2, cpu=1, scheduler="s"))
    admin.set_config(CellConfig({"s": SchedulerLimits(max_resources=Resources.of(cpu=41))}))
    hooked = Interleaving(kv)
    hooked.max_txn_ops = 16  # the staged protocol for 40 claims on 40 machines
    hooked.before_txn = lambda ops: any(b'"committed"' in getattr(o, "value", b"")
                                        for o in ops)
    other = CellStore(kv, cell)
    hooked.hook = lambda: other.commit(Transaction("s", (Claim("k", 0, "m0"),
                                                         Claim("k", 1, "m1"))))
    sched = CellStore(hooked, cell, options=StoreOptions(per_machine_writes="never"))
    res = sched.commit(Transaction("s", tuple(Claim("j", i, f"m{i}") for i in range(tasks)),
                                   TxnMode.GANG))
    assert hooked.fired, "the gang never reached its commit point"
    assert res.committed == ()
    first = res.rejected[0]
    assert (first.reason, first.dimension) == (Reason.LIMIT_EXCEEDED, "cpu")
    assert first.detail == "scheduler 's' would hold 42 cpu, past its limit of 41"
    admin.recover()
    assert running(admin, "j") == [] and running(admin, "k") == ["k/0", "k/1"]
    usage = admin.read_snapshot().usage["s"]
    assert isinstance(usage, UsageRecord) and usage.used.get("cpu") == 2
    assert violations(admin.read_snapshot()) == []


# -- finding 2: a shrink racing a claim -------------------------------------------------


def test_a_shrink_racing_a_claim_beyond_the_new_size_is_refused(kv: KV, cell: str) -> None:
    """The claim for task 3 lands between the shrink's read of the job's tasks and its
    write: the shrink must see it and refuse, not leave task 3 beyond 2 tasks."""
    admin = setup(kv, cell, tasks=4)
    hooked = Interleaving(kv)
    hooked.after_range = lambda key, keys_only: keys_only and b"/tasks/j/" in key
    hooked.hook = lambda: CellStore(kv, cell).commit(
        Transaction("s", (Claim("j", 3, "m0"),)))
    with pytest.raises(StoreError, match="task 3 has run"):
        CellStore(hooked, cell).resize_job("j", 2)
    assert hooked.fired
    snap = admin.read_snapshot()
    assert snap.jobs["j"].task_count == 4
    assert task_view(snap, "j/3").state is TaskState.RUNNING
    assert violations(snap) == []


def test_a_shrink_with_no_racing_claim_still_succeeds(kv: KV, cell: str) -> None:
    admin = setup(kv, cell, tasks=4)
    admin.commit(Transaction("s", (Claim("j", 0, "m0"),)))
    admin.resize_job("j", 2)
    assert admin.read_snapshot().jobs["j"].task_count == 2


# -- finding 3: gang all-or-nothing is the store's rule ------------------------------


def test_an_incremental_claim_for_part_of_a_gang_job_is_refused(kv: KV, cell: str) -> None:
    admin = setup(kv, cell, tasks=3, gang=True)
    res = admin.commit(Transaction("s", (Claim("j", 0, "m0"),)))
    assert res.committed == ()
    assert res.rejected[0].reason is Reason.INVALID
    assert "gang" in res.rejected[0].detail
    assert running(admin, "j") == []


def test_a_gang_transaction_must_claim_every_placeable_task(kv: KV, cell: str) -> None:
    admin = setup(kv, cell, tasks=3, gang=True)
    part = admin.commit(Transaction("s", (Claim("j", 0, "m0"), Claim("j", 1, "m1")),
                                    TxnMode.GANG))
    assert part.committed == ()
    assert "unclaimed" in part.rejected[0].detail
    whole = admin.commit(Transaction("s", tuple(Claim("j", i, f"m{i}") for i in range(3)),
                                     TxnMode.GANG))
    assert len(whole.committed) == 3


def test_a_gang_that_lost_one_task_replaces_just_that_one(kv: KV, cell: str) -> None:
    admin = setup(kv, cell, tasks=3, gang=True)
    admin.commit(Transaction("s", tuple(Claim("j", i, f"m{i}") for i in range(3)), TxnMode.GANG))
    admin.release_task("j/1", TaskState.LOST)
    res = admin.commit(Transaction("s", (Claim("j", 1, "m3"),), TxnMode.GANG))
    assert [c.task for c in res.committed] == ["j/1"]


# -- finding 8: a release answered twice ---------------------------------------------


def test_a_release_reported_twice_gets_the_same_answer(kv: KV, cell: str) -> None:
    """A retried release (its first answer lost, e.g. over an etcd leader change) is
    answered with the revision that applied it, not 'not running'."""
    admin = setup(kv, cell)
    admin.commit(Transaction("s", (Claim("j", 0, "m0"),)))
    first = admin.release_task("j/0", TaskState.FINISHED, "m0")
    again = CellStore(kv, cell).release_task("j/0", TaskState.FINISHED, "m0")
    assert again == first
    with pytest.raises(StoreError, match="not running"):
        admin.release_task("j/0", TaskState.FAILED, "m0")  # a different outcome is not a retry


def test_a_kill_is_not_replaced_by_an_abandonment(kv: KV, cell: str) -> None:
    admin = setup(kv, cell)
    admin.kill_job(JobStatus("j", JobState.KILLED, "user"))
    admin.set_job_status(JobStatus("j", JobState.ABANDONED, "scheduler gave up"))
    assert admin.read_snapshot().statuses["j"].state is JobState.KILLED


# -- a new config's usage counter, started by two stores at once ---------------------


def test_two_stores_starting_a_new_configs_usage_counter_both_go_on(kv: KV,
                                                                    cell: str) -> None:
    """Every store that meets a new resource limit starts the scheduler's usage
    counter. When another store's write lands first (a server that set the limit live,
    while a scheduler commits through another), the loser's commit goes on with that
    counter; it used to fail ("the records changed while writing"), and the scheduler
    then slept its retry delay."""
    admin = setup(kv, cell)
    racing = Interleaving(kv)
    sched = CellStore(racing, cell)
    sched.load()
    usage_key = admin.keys.usage("s")
    # The limit arrives as a config written without its counter (as a server writes it
    # before it starts the counter), and the other store starts the counter exactly
    # between this store's read of it and its own write.
    config = CellConfig({"s": SchedulerLimits(max_resources=Resources.of(cpu=6))})
    kv.txn([], [Put(admin.keys.config, codec.encode_config(config))])
    racing.before_txn = lambda ops: any(isinstance(op, Put) and op.key == usage_key
                                        for op in ops)

    def start_the_counter() -> None:
        admin.load()
        admin._ensure_usage(["s"])

    racing.hook = start_the_counter
    res = sched.commit(Transaction("s", (Claim("j", 0, "m0"),)))
    assert racing.fired
    assert [c.task for c in res.committed] == ["j/0"]
    usage = admin.read_snapshot().usage["s"]
    assert isinstance(usage, UsageRecord) and usage.used == Resources.of(cpu=1, mem=1)
