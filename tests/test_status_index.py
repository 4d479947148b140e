"""The status index (cellstate/jobinfo.py) gives the answers the task-by-task reading
gives, after every batch a replica applies, through claims, releases, evictions,
machines going down, staged gangs in every stage, resizes and verdicts. (That the
server's status calls use it, reading no task, is in tests/api/test_guards.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cellstate.cell import CellSnapshot
from cellstate.jobinfo import StatusIndex, cell_totals, job_summary
from cellstate.keys import KeyKind
from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    GangState,
    JobState,
    JobStatus,
    MachineState,
    Resources,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.replica import Replica
from cellstate.store import CellStore, StoreError
from schedulers.testing import claims, job, machine, make_cell, txn


class Agreement:
    """Checks, after every ``every``-th batch the replica applies, that the index
    answers as job_summary and cell_totals do on the same snapshot (the index counts
    the changes of the batches between two reads when read)."""

    def __init__(self, replica: Replica, every: int = 1) -> None:
        self.index = StatusIndex(replica)
        self.batches = 0
        self.every = every
        self.seen = 0
        self.gang_states: set[GangState] = set()  # the stages of gangs it saw
        replica.on_changes(self.check)

    def check(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        self.seen += 1
        if self.seen % self.every == 0:
            self.verify(snap)

    def verify(self, snap: CellSnapshot) -> None:
        view = self.index.view()
        assert view.snap is snap
        for j in snap.jobs.values():
            assert view.job(j) == job_summary(snap, j), j.id
        got, want = view.totals(), cell_totals(snap)
        for dim in ("capacity", "used"):
            assert got.pop(dim) == pytest.approx(want.pop(dim), abs=1e-6), dim
        assert got == want
        self.batches += 1
        self.gang_states.update(g.state for g in snap.gangs.values())


@pytest.fixture
def followed(kv: KV) -> Iterator[tuple[Replica, Agreement]]:
    replica = Replica(kv)
    agreement = Agreement(replica)
    replica.load()
    yield replica, agreement
    replica.stop()


def catch_up(replica: Replica, kv: KV) -> None:
    target = kv.range(b"\x00", b"\x00").revision
    while replica.revision < target:
        replica.pump(timeout=1.0)


def test_index_agrees_through_claims_releases_and_machine_changes(
        kv: KV, followed: tuple[Replica, Agreement]) -> None:
    replica, agreement = followed
    store = make_cell(kv, [machine(f"m{i}", cpu=4) for i in range(4)],
                      [job("a", tasks=6, cpu=1), job("b", tasks=3, cpu=2, precedence=5,
                                                     scheduler="svc")])
    snap = store.read_snapshot()
    assert store.commit(txn(claims(snap, "a", [(i, f"m{i % 4}") for i in range(6)]))).ok
    for i, outcome in ((0, TaskState.FINISHED), (1, TaskState.FAILED), (2, TaskState.LOST)):
        store.release_task(f"a/{i}", outcome)
    # A preemption, a machine draining, one going down (losing its tasks) and back.
    snap = store.read_snapshot()
    assert store.commit(Transaction("svc", (
        Claim("b", 0, "m3", snap.machines["m3"].seq, evict=("a/3",)),))).ok
    store.update_machine("m1", state=MachineState.DRAINING)
    store.update_machine("m2", state=MachineState.DOWN)
    store.update_machine("m2", state=MachineState.UP, capacity=Resources.of(cpu=8, mem=16))
    store.resize_job("a", 9)
    store.set_job_status(JobStatus("b", JobState.KILLED, "by a test", "t", 1.0))
    store.remove_machine("m0")
    catch_up(replica, kv)
    assert agreement.batches >= 10
    view = agreement.index.view()
    assert view.job(store.read_snapshot().jobs["a"]).task_states == {
        "failed": 1, "finished": 1, "lost": 2, "pending": 3, "preempted": 1, "running": 1}


def test_index_agrees_through_every_stage_of_a_staged_gang(
        kv: KV, followed: tuple[Replica, Agreement]) -> None:
    replica, agreement = followed
    n = 40
    store = make_cell(kv, [machine(f"m{i}", cpu=2) for i in range(n)],
                      [job("low", tasks=n, cpu=2, precedence=1),
                       job("big", tasks=n * 2, cpu=1, precedence=5, scheduler="svc")])
    assert store.commit(txn([Claim("low", i, f"m{i}") for i in range(n)])).ok
    catch_up(replica, kv)
    # Stop after the commit point, as a crashed committer would: tagged records and
    # a committed gang record stay until someone settles them.
    store.finalize_gang = lambda *a, **k: None  # type: ignore[method-assign]
    snap = store.read_snapshot()
    cs = []
    for i in range(n):
        seq = snap.machines[f"m{i}"].seq
        cs += [Claim("big", 2 * i, f"m{i}", seq, evict=(f"low/{i}",)),
               Claim("big", 2 * i + 1, f"m{i}", seq)]
    assert store.commit(Transaction("svc", tuple(cs), mode=TxnMode.GANG)).ok
    catch_up(replica, kv)
    assert len(replica.snapshot().gangs) == 1
    assert CellStore(kv).recover()
    catch_up(replica, kv)
    assert not replica.snapshot().gangs
    assert agreement.gang_states == {GangState.PREPARING, GangState.COMMITTED}
    big = agreement.index.view().job(replica.snapshot().jobs["big"])
    assert big.task_states == {"running": 2 * n}
    low = agreement.index.view().job(replica.snapshot().jobs["low"])
    assert low.task_states == {"preempted": n}


def test_index_agrees_when_a_staged_gang_aborts(
        kv: KV, followed: tuple[Replica, Agreement]) -> None:
    replica, agreement = followed
    n_machines, n_tasks = 60, 240
    store = make_cell(kv, [machine(f"m{i}", cpu=4) for i in range(n_machines)],
                      [job("big", tasks=n_tasks), job("rival", cpu=4, scheduler="svc")])
    rival = CellStore(kv)
    writes = 0
    original = store._try_write

    def racing_write(w: Any) -> Any:
        nonlocal writes
        writes += 1
        if writes == 3:  # after the gang record and the first staged group
            assert rival.commit(Transaction("svc", (Claim("rival", 0, "m59"),))).ok
        return original(w)

    store._try_write = racing_write  # type: ignore[method-assign]
    snap = store.read_snapshot()
    per = n_tasks // n_machines  # machine by machine: m59 is staged in the last group
    res = store.commit(txn(claims(snap, "big", [(i, f"m{i // per}")
                                                for i in range(n_tasks)]), gang=True))
    assert res.committed == ()
    catch_up(replica, kv)
    assert agreement.gang_states == {GangState.PREPARING}


ops = st.lists(st.one_of(
    st.tuples(st.just("place"), st.integers(0, 7), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 7),
              st.sampled_from([TaskState.FINISHED, TaskState.FAILED, TaskState.LOST])),
    st.tuples(st.just("machine"), st.integers(0, 2),
              st.sampled_from(list(MachineState))),
    st.tuples(st.just("resize"), st.integers(8, 12)),
), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(1, 4))
def test_index_agrees_on_random_histories(program: list[tuple[Any, ...]], every: int) -> None:
    """Read after every batch, or after every 2nd to 4th: the counts brought up to date
    over several batches at once are those followed batch by batch."""
    kv = MemoryKV()
    store = make_cell(kv, [machine(f"m{i}", cpu=3) for i in range(3)],
                      [job("lo", tasks=8, cpu=1, precedence=1),
                       job("hi", tasks=4, cpu=2, precedence=3, scheduler="svc")])
    replica = Replica(kv)
    agreement = Agreement(replica, every)
    replica.load()
    hi = 0
    for op in program:
        snap = store.read_snapshot()
        try:
            if op[0] == "place":
                _, index, m, preempt = op
                mid = f"m{m}"
                seq = snap.machines[mid].seq
                if preempt and hi < 4:
                    victims = [t for t in snap.machines[mid].allocations if t.startswith("lo/")]
                    store.commit(Transaction("svc", (Claim("hi", hi, mid, seq,
                                                           evict=tuple(victims[:1])),)))
                    hi += 1
                else:
                    store.commit(Transaction("batch", (Claim("lo", index, mid, seq),)))
            elif op[0] == "release":
                store.release_task(f"lo/{op[1]}", op[2])
            elif op[0] == "machine":
                store.update_machine(f"m{op[1]}", state=op[2])
            else:
                store.resize_job("lo", op[1])
        except StoreError:
            pass  # refused (not running, cannot shrink): the histories still agree
        catch_up(replica, kv)
    agreement.verify(replica.snapshot())  # the batches since the last read, at once
    assert agreement.batches >= 1
