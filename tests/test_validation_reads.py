"""What each rejection of validate() says, and what its decision read.

The detail is the sentence a scheduler's log and ``omega why-pending`` show: it must
say what is wrong and where. The reads are the records the store guards by revision
when it writes the decision (cellstate/validation.py): a record missing from them is
a race the store no longer sees (a claim refused on a job's record while the job is
resized, say). Written against the survivors of a mutation-testing run
(docs/testing.md), where a message replaced by None or a read dropped went unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import immutables
import pytest

from cellstate.cell import CellSnapshot
from cellstate.model import (
    Claim,
    GangRecord,
    GangState,
    JobState,
    JobStatus,
    Reason,
    Rejection,
    TaskRecord,
    TaskState,
    Transaction,
)
from cellstate.validation import Reads, validate
from schedulers.testing import job, machine
from tests.test_validation import CASES, cell, running


def _reads(machines: Iterable[str] = (), tasks: Iterable[str] = (), jobs: Iterable[str] = (),
           gangs: Iterable[str] = (), usage: Iterable[str] = (),
           statuses: Iterable[str] = ()) -> Reads:
    return Reads(frozenset(machines), frozenset(tasks), frozenset(jobs), frozenset(gangs),
                 frozenset(usage), frozenset(statuses))


# case in tests/test_validation.CASES -> (detail, dimension, reads)
EXPECTED: dict[str, tuple[str, str, Reads]] = {
    # An unknown job is refused on its absence: a job submitted meanwhile must retry it.
    "unknown job": ("unknown job 'nope'", "", _reads(jobs={"nope"})),
    "other scheduler's job": ("job 'j' belongs to scheduler 'batch', not 'svc'", "",
                              _reads(jobs={"j"})),
    "task out of range": ("job 'j' has 4 tasks; there is no task 4", "",
                          _reads(jobs={"j"}, statuses={"j"})),
    "already running": ("task j/0 is running on machine 'm1'", "",
                        _reads(tasks={"j/0"}, jobs={"j"}, statuses={"j"})),
    "reserved by a gang in flight": (
        "task j/0 is reserved by gang g1 in flight", "",
        _reads(tasks={"j/0"}, jobs={"j"}, gangs={"g1"}, statuses={"j"})),
    "unknown machine": ("unknown machine 'm9'", "",
                        _reads({"m9"}, {"j/0"}, {"j"}, statuses={"j"})),
    "coarse, sequence moved": ("machine 'm1' is at sequence 7, the claim saw 6", "",
                               _reads({"m1"}, {"j/0"}, {"j"}, statuses={"j"})),
    "draining machine": ("machine 'm1' is draining", "",
                         _reads({"m1"}, {"j/0"}, {"j"}, statuses={"j"})),
    "precedence above the scheduler's limit": (
        "job 'hi' has precedence 5, above scheduler 'batch''s limit of 4", "",
        _reads({"m1"}, {"hi/0"}, {"hi"}, statuses={"hi"})),
    "victim of equal precedence, another scheduler's": (
        "cannot evict low/0 (precedence 5, scheduler 'svc') for task hi/0 (precedence 5): "
        "victims must have lower precedence, or the same and be the scheduler's own", "",
        _reads({"m1"}, {"hi/0", "low/0"}, {"hi"}, statuses={"hi"})),
    "victim of higher precedence, the scheduler's own": (
        "cannot evict low/0 (precedence 6, scheduler 'batch') for task hi/0 (precedence 5): "
        "victims must have lower precedence, or the same and be the scheduler's own", "",
        _reads({"m1"}, {"hi/0", "low/0"}, {"hi"}, statuses={"hi"})),
    "selector": ("machine 'm1' does not match the selector", "",
                 _reads({"m1"}, {"j/0"}, {"j"}, statuses={"j"})),
    "does not fit": ("machine 'm1' has 1 cpu free, task needs 2", "cpu",
                     _reads({"m1"}, {"j/0"}, {"j"}, statuses={"j"})),
    # The staged hold is read through its gang: the gang's abort frees the room.
    "preparing gang's hold counts": ("machine 'm1' has 1 cpu free, task needs 2", "cpu",
                                     _reads({"m1"}, {"j/0"}, {"j"}, {"g1"}, statuses={"j"})),
    "resource limit": (
        "scheduler 'batch' holds 2 cpu; this task would take it past its limit of 3", "cpu",
        _reads({"m1"}, {"j/0"}, {"j"}, usage={"batch"}, statuses={"j"})),
}


def test_every_rule_has_its_expected_detail_and_reads() -> None:
    assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_each_rejection_says_what_and_where_and_reads_what_it_relied_on(name: str) -> None:
    make, txn, _reason = CASES[name]
    detail, dimension, reads = EXPECTED[name]
    d = validate(make(), txn)
    (claim,) = txn.claims
    (r,) = d.rejected
    assert (r.claim, r.detail, r.dimension) == (claim, detail, dimension)
    assert d.reads == reads
    assert d.claim_machines == {claim.task: reads.machines}


def test_the_gangs_of_every_staged_hold_read_are_guarded() -> None:
    """Two machines with holds of two gangs in flight: the decision relies on both
    gangs' records (an abort frees the room), and on each machine."""
    m1 = running(machine("m1", cpu=8), "x/0", "x", 1, gang="g1")
    m2 = running(machine("m2", cpu=8), "y/0", "y", 1, gang="g2")
    snap = cell([m1, m2], [job("x"), job("y"), job("j", tasks=2)],
                gangs=[GangRecord("g1", "batch", GangState.PREPARING, 1),
                       GangRecord("g2", "batch", GangState.PREPARING, 1)])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 1, "m2"))))
    assert not d.rejected, d.rejected
    assert d.reads == _reads({"m1", "m2"}, {"j/0", "j/1"}, {"j"}, {"g1", "g2"},
                             statuses={"j"})
    assert d.claim_machines == {"j/0": {"m1"}, "j/1": {"m2"}}


def _one(snap: CellSnapshot, claim: Claim) -> tuple[Rejection, Reads]:
    d = validate(snap, Transaction("batch", (claim,)))
    (r,) = d.rejected
    assert r.claim == claim
    return r, d.reads


def test_a_claim_for_a_killed_job_says_so_and_reads_the_status() -> None:
    snap = cell([machine("m1")], [job("j")])
    snap = attrs.evolve(snap, statuses=immutables.Map(
        {"j": JobStatus("j", JobState.KILLED, "the owner withdrew it")}))
    r, reads = _one(snap, Claim("j", 0, "m1"))
    assert (r.reason, r.detail) == (Reason.JOB_ENDED, "job 'j' was killed: the owner withdrew it")
    assert reads == _reads(jobs={"j"}, statuses={"j"})


def test_a_task_that_ended_says_how_without_a_machine() -> None:
    snap = cell([machine("m1")], [job("j")], [TaskRecord("j", 0, TaskState.FINISHED)])
    r, reads = _one(snap, Claim("j", 0, "m1"))
    assert (r.reason, r.detail) == (Reason.TASK_ALREADY_PLACED, "task j/0 is finished")
    assert reads == _reads(tasks={"j/0"}, jobs={"j"}, statuses={"j"})


def test_a_task_evicted_earlier_in_the_transaction_is_not_claimable_in_it() -> None:
    """check_shape refuses such a transaction; validate() refuses the claim too when
    the caller says the shape was checked (the store's split parts)."""
    m1 = running(machine("m1", cpu=8), "low/0", "low", 1)
    snap = cell([m1], [job("low"), job("hi", precedence=5)],
                [TaskRecord("low", 0, TaskState.RUNNING, "m1", "batch")])
    again = Claim("low", 0, "m1")
    d = validate(snap, Transaction("batch", (Claim("hi", 0, "m1", evict=("low/0",)), again)),
                 shape_checked=True)
    assert [(r.claim, r.reason, r.detail) for r in d.rejected] == [
        (again, Reason.TASK_ALREADY_PLACED, "task low/0 changed earlier in this transaction")]


def test_a_task_a_gang_placed_before_is_read_through_its_gang() -> None:
    """A task lost after its gang committed may be placed again; the decision relies on
    the gang's record (its state says whether the record is the task's last word)."""
    snap = cell([machine("m1")], [job("j")], [TaskRecord("j", 0, TaskState.LOST, "", "batch",
                                                         "g1")],
                gangs=[GangRecord("g1", "batch", GangState.COMMITTED, 1)])
    d = validate(snap, Transaction("batch", (Claim("j", 0, "m1"),)))
    assert not d.rejected, d.rejected
    assert d.reads == _reads({"m1"}, {"j/0"}, {"j"}, {"g1"}, statuses={"j"})
