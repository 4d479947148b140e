"""validate() and check_batch() at edges a mutation-testing run found unpinned
(docs/testing.md): usage limits across the transactions of one batch, gang coverage
with tasks that ran before or that number in the thousands, moves of tasks a gang in
flight evicts, moves beside new placements at a scheduler's limit, and the batch
shape's limits and messages."""

from __future__ import annotations

import attrs
import pytest

from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    CellConfig,
    Claim,
    Constraints,
    Detection,
    GangRecord,
    GangState,
    Job,
    JobState,
    JobStatus,
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
from cellstate.store import CellStore
from cellstate.validation import (
    MAX_CLAIMS_PER_TRANSACTION,
    MAX_TRANSACTIONS_PER_COMMIT,
    TransactionError,
    check_batch,
    validate,
    validate_many,
)
from schedulers.testing import job, machine, make_cell
from tests.test_validation import cell, running

M1, M2 = machine("m1", cpu=8), machine("m2", cpu=8)


def _limited(cpu_limit: float) -> CellConfig:
    return CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=cpu_limit))}, 50)


def test_a_batch_counts_earlier_transactions_against_a_limit() -> None:
    """The scheduler holds 2 of its 3 cpu: the first transaction takes the third, so
    the second, deciding over the first, is past the limit."""
    snap = cell([M1], [job("a", cpu=1), job("b", cpu=1)], config=_limited(3),
                usage=[UsageRecord("batch", 50, Resources.of(cpu=2), 60)])
    first, second = validate_many(snap, [Transaction("batch", (Claim("a", 0, "m1"),)),
                                         Transaction("batch", (Claim("b", 0, "m1"),))])
    assert [c.task for c in first.accepted] == ["a/0"]
    assert [(r.claim.task, r.reason, r.dimension) for r in second.rejected] == [
        ("b/0", Reason.LIMIT_EXCEEDED, "cpu")]


def test_a_batch_counts_what_earlier_transactions_evicted_from_a_limited_scheduler() -> None:
    """The limited scheduler holds its whole limit, so a task of its own alone is
    refused; once another scheduler's transaction in the same batch evicts one of its
    tasks, the same claim fits the limit."""
    m1 = running(running(M1, "x/0", "x", 1), "x/1", "x", 1)
    snap = cell([m1, M2], [job("x", tasks=2, cpu=1), job("y", cpu=1),
                           job("hi", cpu=7, precedence=5, scheduler="svc")],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch"),
                 TaskRecord("x", 1, TaskState.RUNNING, "m1", "batch")],
                config=_limited(2), usage=[UsageRecord("batch", 50, Resources.of(cpu=2))])
    place = Transaction("batch", (Claim("y", 0, "m2"),))
    assert [r.reason for r in validate(snap, place).rejected] == [Reason.LIMIT_EXCEEDED]
    evict, placed = validate_many(snap, [
        Transaction("svc", (Claim("hi", 0, "m1", evict=("x/0",)),)), place])
    assert evict.evicted == ("x/0",) and not evict.rejected
    assert not placed.rejected, placed.rejected


def test_moves_beside_a_new_placement_at_a_limit() -> None:
    """Two moves and a new task in one transaction of a scheduler at 2 of its 3 cpu:
    the moves leave what it holds as it was, so the new task fits the limit."""
    m1 = running(running(M1, "x/0", "x", 1), "x/1", "x", 1)
    snap = cell([m1, M2], [job("x", tasks=3, cpu=1)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch"),
                 TaskRecord("x", 1, TaskState.RUNNING, "m1", "batch")],
                config=_limited(3), usage=[UsageRecord("batch", 50, Resources.of(cpu=2))])
    d = validate(snap, Transaction("batch", (
        Claim("x", 0, "m2", moves_from="m1"), Claim("x", 1, "m2", moves_from="m1"),
        Claim("x", 2, "m2"))))
    assert not d.rejected, d.rejected
    assert d.machines["m1"].allocations == {}
    assert sorted(d.machines["m2"].allocations) == ["x/0", "x/1", "x/2"]


def test_a_move_of_a_task_a_gang_in_flight_evicts_is_refused() -> None:
    m1 = running(M1, "x/0", "x", 1, evicted_by="g1")
    snap = cell([m1, M2], [job("x", cpu=1)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch")],
                gangs=[GangRecord("g1", "svc", GangState.PREPARING, 1)])
    d = validate(snap, Transaction("batch", (Claim("x", 0, "m2", moves_from="m1"),)))
    assert [(r.claim.task, r.reason, r.detail) for r in d.rejected] == [
        ("x/0", Reason.INVALID, "cannot move task x/0: gang g1 in flight evicts it")]


def test_a_move_of_a_task_that_never_ran_says_where_it_is_not() -> None:
    snap = cell([M1, M2], [job("x", cpu=1)])
    d = validate(snap, Transaction("batch", (Claim("x", 0, "m2", moves_from="m1"),)))
    assert [r.detail for r in d.rejected] == ["cannot move task x/0 from 'm1': it is pending"]


# -- gang coverage -------------------------------------------------------------------


def _gang(tasks: int) -> Job:
    return job("g", tasks=tasks, cpu=0.001, mem=0, gang=True)


def test_a_gang_need_not_claim_tasks_that_finished() -> None:
    snap = cell([M1], [_gang(3)], [TaskRecord("g", 0, TaskState.FINISHED, "", "batch")])
    d = validate(snap, Transaction("batch", (Claim("g", 1, "m1"), Claim("g", 2, "m1")),
                                   TxnMode.GANG))
    assert not d.rejected, d.rejected


@pytest.mark.parametrize("state", [TaskState.LOST, TaskState.PREEMPTED])
def test_a_gang_must_claim_its_lost_and_preempted_tasks(state: TaskState) -> None:
    snap = cell([M1], [_gang(3)], [TaskRecord("g", 0, state, "", "batch")])
    d = validate(snap, Transaction("batch", (Claim("g", 1, "m1"), Claim("g", 2, "m1")),
                                   TxnMode.GANG))
    assert {r.reason for r in d.rejected} == {Reason.INVALID}
    assert d.rejected[0].detail == ("job 'g' is a gang: the transaction leaves 1 of its "
                                    "placeable tasks unclaimed (first: task 0)")


def test_a_gang_of_thousands_claimed_in_part_is_refused_with_the_count_it_leaves() -> None:
    """(The rule once stopped counting at 1,001 and said so for any number beyond.)"""
    snap = cell([M1], [_gang(1500)])
    d = validate(snap, Transaction("batch", (Claim("g", 0, "m1"),), TxnMode.GANG))
    assert [(r.reason, r.detail) for r in d.rejected] == [
        (Reason.INVALID, "job 'g' is a gang: the transaction leaves 1499 of its placeable "
                         "tasks unclaimed (first: task 1)")]


# -- the shape of a batch --------------------------------------------------------------


def _txn(claims: int, first: int = 0) -> Transaction:
    return Transaction("batch", tuple(Claim("j", first + i, "m1") for i in range(claims)))


@pytest.mark.parametrize(("batch", "message"), [
    ("not a list", "transactions must be a sequence of Transaction"),
    ([], "no transactions to commit"),
    ([_txn(1), "txn"], "transactions[1] is not a Transaction"),
    ([_txn(1)] * (MAX_TRANSACTIONS_PER_COMMIT + 1),
     f"{MAX_TRANSACTIONS_PER_COMMIT + 1} transactions in one commit, more than the limit of "
     f"{MAX_TRANSACTIONS_PER_COMMIT}"),
    ([_txn(MAX_CLAIMS_PER_TRANSACTION // 2), _txn(MAX_CLAIMS_PER_TRANSACTION // 2 + 1)],
     f"{MAX_CLAIMS_PER_TRANSACTION + 1} claims in one commit, more than the limit of "
     f"{MAX_CLAIMS_PER_TRANSACTION}"),
])
def test_a_malformed_batch_is_refused_saying_what_is_wrong(batch: object, message: str) -> None:
    with pytest.raises(TransactionError) as info:
        check_batch(batch)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_a_batch_at_the_limits_passes() -> None:
    check_batch([_txn(1)] * MAX_TRANSACTIONS_PER_COMMIT)
    half = MAX_CLAIMS_PER_TRANSACTION // 2
    check_batch([_txn(half), _txn(MAX_CLAIMS_PER_TRANSACTION - half)])


def test_validate_many_checks_each_transactions_shape() -> None:
    snap = cell([M1], [job("j")])
    bad = Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 0, "m1")))
    with pytest.raises(TransactionError, match="claim 1: task j/0 is already claimed"):
        validate_many(snap, [_txn(1), bad])


# -- a batch: later transactions decide over the earlier ones' records -------------------


def _placed_machine() -> Machine:
    return attrs.evolve(machine("m1", cpu=8, rack="r1", failure_domain="fd1",
                                labels=[("zone", "a")]), agent="ag1")


def test_a_later_transaction_sees_a_rewritten_machine_with_all_it_was() -> None:
    """The second transaction's job selects by rack, failure domain and label, and lands
    on the machine the first rewrote: that copy keeps them, and the machine record the
    second decision writes is the machine as it was plus both tasks."""
    select = Constraints(machine_selector=(Requirement("rack", SelectorOp.IN, ("r1",)),
                                           Requirement("failure_domain", SelectorOp.IN, ("fd1",)),
                                           Requirement("zone", SelectorOp.IN, ("a",))))
    m1 = _placed_machine()
    snap = cell([m1], [job("a", cpu=1), job("b", cpu=1, constraints=select)])
    first, second = validate_many(snap, [Transaction("batch", (Claim("a", 0, "m1"),)),
                                         Transaction("batch", (Claim("b", 0, "m1"),))])
    assert not first.rejected and not second.rejected, second.rejected
    written = second.machines["m1"]
    assert (written.rack, written.failure_domain, written.labels, written.agent) == (
        "r1", "fd1", (("zone", "a"),), "ag1")
    assert sorted(written.allocations) == ["a/0", "b/0"]
    assert written.settled_used == Resources.of(cpu=2, mem=2)


def test_coarse_claims_on_a_machine_an_earlier_transaction_rewrote_conflict() -> None:
    """As after a separate commit, the machine is at a sequence the claim did not see
    (the batch's copy reads at -1, which no scheduler sees)."""
    snap = cell([M1], [job("a", cpu=1), job("b", cpu=1)])
    _, second = validate_many(snap, [
        Transaction("batch", (Claim("a", 0, "m1"),)),
        Transaction("batch", (Claim("b", 0, "m1", 0),), detection=Detection.COARSE)])
    assert [(r.reason, r.detail) for r in second.rejected] == [
        (Reason.SEQUENCE_CHANGED, "machine 'm1' is at sequence -1, the claim saw 0")]


def test_validate_many_passes_each_transaction_its_own_sequence_rewrites() -> None:
    snap = cell([attrs.evolve(M1, seq=12), attrs.evolve(M2, seq=20)], [job("a"), job("b")])
    txns = [Transaction("batch", (Claim("a", 0, "m1", 10),), detection=Detection.COARSE),
            Transaction("batch", (Claim("b", 0, "m2", 18),), detection=Detection.COARSE)]
    first, second = validate_many(snap, txns, seq_rewrites=[{"m1": (10, 12)}, {"m2": (18, 20)}])
    assert not first.rejected and not second.rejected
    first, second = validate_many(snap, txns, seq_rewrites=[{"m1": (10, 12)}, {}])
    assert not first.rejected
    assert [r.reason for r in second.rejected] == [Reason.SEQUENCE_CHANGED]


def test_a_task_an_earlier_transaction_preempted_may_be_placed_by_a_later_one() -> None:
    m1 = running(M1, "x/0", "x", 1)
    snap = cell([m1, M2], [job("x", cpu=1), job("hi", cpu=8, precedence=5, scheduler="svc")],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch")])
    evict, again = validate_many(snap, [
        Transaction("svc", (Claim("hi", 0, "m1", evict=("x/0",)),)),
        Transaction("batch", (Claim("x", 0, "m2"),))])
    assert evict.evicted == ("x/0",)
    assert [c.task for c in again.accepted] == ["x/0"], again.rejected


def test_a_task_running_before_the_batch_is_still_placed_for_a_later_transaction() -> None:
    m1 = running(M1, "x/0", "x", 1)
    snap = cell([m1, M2], [job("x", cpu=1), job("a", cpu=1)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch")])
    _, second = validate_many(snap, [Transaction("batch", (Claim("a", 0, "m2"),)),
                                     Transaction("batch", (Claim("x", 0, "m2"),))])
    assert [(r.reason, r.detail) for r in second.rejected] == [
        (Reason.TASK_ALREADY_PLACED, "task x/0 is running on machine 'm1'")]


# -- moves: what the old machine holds ---------------------------------------------------


def test_a_move_from_a_machine_with_an_aborted_gangs_hold_drops_the_hold() -> None:
    m1 = running(running(M1, "x/0", "x", 1), "y/0", "y", 2, gang="gone")
    snap = cell([m1, M2], [job("x", cpu=1), job("y", cpu=2)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch")])
    d = validate(snap, Transaction("batch", (Claim("x", 0, "m2", moves_from="m1"),)))
    assert not d.rejected, d.rejected
    assert dict(d.machines["m1"].allocations) == {}
    assert sorted(d.machines["m2"].allocations) == ["x/0"]


def test_a_task_a_committed_gang_placed_moves_off_without_freeing_room_twice() -> None:
    """x/0 came with a committed gang (its hold is tagged, outside the settled sum). It
    moves to m2; in the same transaction z/0 (3 cpu) asks for m1, where y/0 still holds
    2 of 4: it does not fit."""
    m1 = running(running(machine("m1", cpu=4), "x/0", "x", 2, gang="g1"), "y/0", "y", 2)
    snap = cell([m1, M2], [job("x", cpu=2), job("y", cpu=2), job("z", cpu=3)],
                [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch", "g1"),
                 TaskRecord("y", 0, TaskState.RUNNING, "m1", "batch")],
                gangs=[GangRecord("g1", "batch", GangState.COMMITTED, 1)])
    d = validate(snap, Transaction("batch", (Claim("x", 0, "m2", moves_from="m1"),
                                             Claim("z", 0, "m1"))))
    assert [c.task for c in d.accepted] == ["x/0"]
    assert [(r.claim.task, r.reason, r.detail) for r in d.rejected] == [
        ("z/0", Reason.INSUFFICIENT_RESOURCES, "machine 'm1' has 2 cpu free, task needs 3")]
    assert d.machines["m1"].settled_used == Resources.of(cpu=2, mem=1)


def test_a_move_from_a_machine_the_cell_does_not_have_is_refused() -> None:
    """The task's record says it runs on m9, which is gone: refused, not a crash."""
    snap = cell([M2], [job("x", cpu=1)], [TaskRecord("x", 0, TaskState.RUNNING, "m9", "batch")])
    claim = Claim("x", 0, "m2", moves_from="m9")
    d = validate(snap, Transaction("batch", (claim,)))
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (claim, Reason.INVALID, "cannot move task x/0: it does not run on 'm9'")]


def test_move_refusals_name_the_claim_and_say_why() -> None:
    pending = Claim("x", 0, "m2", moves_from="m1")
    snap = cell([M1, M2], [job("x", cpu=1)])
    assert [(r.claim, r.detail) for r in validate(snap, Transaction("batch", (pending,))).rejected
            ] == [(pending, "cannot move task x/0 from 'm1': it is pending")]
    snap = cell([M1, M2], [job("x", cpu=1)], [TaskRecord("x", 0, TaskState.RUNNING, "m1", "batch")])
    staged = validate(snap, Transaction("batch", (pending,), TxnMode.GANG), staging_gang="g1")
    assert [(r.claim, r.detail) for r in staged.rejected] == [
        (pending, "cannot move task x/0: a move cannot be part of a gang too large for one "
                  "etcd transaction")]
    assert [(r.claim, r.detail) for r in validate(snap, Transaction("batch", (pending,))).rejected
            ] == [(pending, "cannot move task x/0: it does not run on 'm1'")]


# -- a gang job with a verdict ----------------------------------------------------------


@pytest.mark.parametrize("mode", [TxnMode.GANG, TxnMode.INCREMENTAL])
@pytest.mark.parametrize("placed_before", [False, True])
def test_claims_of_a_killed_gang_job_are_refused_as_job_ended(
        mode: TxnMode, placed_before: bool) -> None:
    """Whatever the claims cover or the mode, a killed gang job takes no placement, and
    says so; a store whose view has not seen the kill reads it before answering (a
    property test found the store answering 'invalid' from the stale view)."""
    kv = MemoryKV()
    admin = make_cell(kv, [M1], [_gang(3)])
    store = CellStore(kv)
    seq = store.read_snapshot().machines["m1"].seq
    if placed_before:
        whole = tuple(Claim("g", i, "m1", seq) for i in range(3))
        assert store.commit(Transaction("batch", whole, TxnMode.GANG)).ok
        seq = store.read_snapshot().machines["m1"].seq
    admin.kill_job(JobStatus("g", JobState.KILLED, "by the test", "tester"))
    res = store.commit(Transaction("batch", (Claim("g", 0, "m1", seq),), mode))
    assert [(r.claim.task, r.reason) for r in res.rejected] == [("g/0", Reason.JOB_ENDED)]
    assert res.committed == ()


def test_a_gang_claim_from_a_stale_view_is_refused_for_the_tasks_it_leaves_unclaimed() -> None:
    """The view has not seen a machine go down under the gang: two of its tasks are lost
    meanwhile. A claim of only one of them is refused for what it leaves unclaimed, as
    on the fresh cell, not for the machine's state (the unclaimed tasks' records are
    read by the decision, so a stale copy of them is read again; a property test found
    the store answering machine_down)."""
    kv = MemoryKV()
    admin = make_cell(kv, [machine("m0", cpu=8), machine("m1", cpu=8)], [_gang(3)])
    store = CellStore(kv)
    snap = store.read_snapshot()
    seqs = {m: snap.machines[m].seq for m in ("m0", "m1")}
    whole = tuple(Claim("g", i, m, seqs[m]) for i, m in enumerate(("m0", "m0", "m1")))
    assert store.commit(Transaction("batch", whole, TxnMode.GANG)).ok
    seq = store.read_snapshot().machines["m0"].seq
    admin.update_machine("m0", state=MachineState.DOWN)
    res = store.commit(Transaction("batch", (Claim("g", 0, "m0", seq),), TxnMode.GANG))
    assert [(r.claim.task, r.reason) for r in res.rejected] == [("g/0", Reason.INVALID)]
    assert "leaves 1 of its placeable tasks unclaimed" in res.rejected[0].detail
