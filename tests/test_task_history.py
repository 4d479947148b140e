"""A task's record keeps when its run was placed and its latest events (who placed,
preempted, lost or killed it, and why), dated by the committing store's clock: what the
fair scheduler (Cook orders a user's running tasks by start), `omega events`, `omega
machine` and the dashboard read (issue 34, for issue 30)."""

from __future__ import annotations

import itertools

import attrs

from cellstate.kv.base import KV
from cellstate.model import (
    HISTORY,
    Claim,
    JobState,
    JobStatus,
    MachineState,
    TaskState,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine, txn


def _store(kv: KV) -> CellStore:
    ticks = itertools.count(1000)
    store = CellStore(kv, clock=lambda: float(next(ticks)))
    store.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    store.submit_job(job("low", tasks=1, cpu=4))
    store.submit_job(attrs.evolve(job("high", tasks=1, cpu=4, scheduler="svc"), precedence=5))
    return store


def _events(store: CellStore, tid: str) -> list[tuple[str, str, str, str]]:
    rec = store.read_snapshot().tasks[tid]
    return [(e.state.value, e.machine, e.by, e.why) for e in rec.history]


def test_placements_preemptions_losses_and_kills_are_kept_with_who_and_why(kv: KV) -> None:
    store = _store(kv)
    assert store.commit(txn([Claim("low", 0, "m1")])).ok
    placed = store.read_snapshot().tasks["low/0"]
    assert placed.placed_at > 0 and placed.history[-1].at == placed.placed_at
    # Preempted on m1 by the service scheduler's higher job.
    assert store.commit(txn([Claim("high", 0, "m1", evict=("low/0",))], scheduler="svc")).ok
    # Placed again on m2, which then goes down (its agent's lease lapsed).
    assert store.commit(txn([Claim("low", 0, "m2")])).ok
    again = store.read_snapshot().tasks["low/0"]
    assert again.placed_at > placed.placed_at  # the start of this run, not the first
    store.update_machine("m2", state=MachineState.DOWN)
    assert _events(store, "low/0") == [
        ("running", "m1", "batch", "placed"),
        ("preempted", "m1", "svc", "preempted for high/0"),
        ("running", "m2", "batch", "placed"),
        ("lost", "m2", "", "machine m2 down"),
    ]
    ats = [e.at for e in store.read_snapshot().tasks["low/0"].history]
    assert ats == sorted(ats) and len(set(ats)) == 4
    # A kill stops what runs, as killed, by whom and why.
    store.kill_job(JobStatus("high", JobState.KILLED, "not needed", by="user:alice"))
    assert _events(store, "high/0")[-1] == ("killed", "m1", "user:alice",
                                            "job killed: not needed")


def test_the_history_keeps_the_latest_events_only(kv: KV) -> None:
    store = _store(kv)
    for _ in range(HISTORY):
        assert store.commit(txn([Claim("low", 0, "m1")])).ok
        store.release_task("low/0", TaskState.LOST, why="test")
    history = store.read_snapshot().tasks["low/0"].history
    assert len(history) == HISTORY
    assert [e.state for e in history[-2:]] == [TaskState.RUNNING, TaskState.LOST]


def test_a_machine_lost_by_another_store_keeps_its_tasks_histories(kv: KV) -> None:
    """The store that takes a machine down (a server reaping a lapsed agent, an
    operator's drain) may never have read the records of the tasks it loses: it reads
    them first, so their histories go on."""
    store = _store(kv)
    assert store.commit(txn([Claim("low", 0, "m1")])).ok
    other = CellStore(kv, clock=lambda: 2000.0)  # knows nothing of low/0 yet
    other.set_machine_state("m1", "drain")
    assert _events(store, "low/0") == [("running", "m1", "batch", "placed"),
                                       ("lost", "m1", "", "machine m1 drained")]
