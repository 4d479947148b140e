"""validate() and check_batch() at edges a mutation-testing run found unpinned
(docs/testing.md): usage limits across the transactions of one batch, gang coverage
with tasks that ran before or that number in the thousands, moves of tasks a gang in
flight evicts, moves beside new placements at a scheduler's limit, and the batch
shape's limits and messages."""

from __future__ import annotations

import pytest

from cellstate.model import (
    CellConfig,
    Claim,
    GangRecord,
    GangState,
    Job,
    Reason,
    Resources,
    SchedulerLimits,
    TaskRecord,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
)
from cellstate.validation import (
    MAX_CLAIMS_PER_TRANSACTION,
    MAX_TRANSACTIONS_PER_COMMIT,
    TransactionError,
    check_batch,
    validate,
    validate_many,
)
from schedulers.testing import job, machine
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


def test_a_gang_of_thousands_claimed_in_part_is_refused() -> None:
    """Past 1,000 unclaimed tasks the rule stops counting, and still refuses."""
    snap = cell([M1], [_gang(1500)])
    d = validate(snap, Transaction("batch", (Claim("g", 0, "m1"),), TxnMode.GANG))
    assert [r.reason for r in d.rejected] == [Reason.INVALID]
    assert "unclaimed (first: task 1)" in d.rejected[0].detail


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
