"""A gang of 10,000 tasks over 2,000 machines commits atomically through etcd, whose
transactions take 128 operations at most: no reader ever sees part of it, and a
committer killed at any point leaves all of it or none of it once recovery has run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cellstate.cell import CellSnapshot
from cellstate.invariants import placed_tasks_of, violations
from cellstate.kv.base import KV, EventType
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Transaction, TxnMode
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.etcd_fixture import EtcdServer
from tests.integration.gang_proc import gang_claims

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

MACHINES, TASKS, TTL = 2000, 10_000, 2


class Observer:
    """Follows the cell with a replica and records every placed-task count it sees."""

    def __init__(self, kv: KV, cell: str) -> None:
        self.counts: list[int] = []
        self.replica = Replica(kv, cell)
        self.replica.on_change(self._seen)
        self.replica.start()

    def _seen(self, snap: CellSnapshot) -> None:
        self.counts.append(placed_tasks_of(snap, "huge"))

    def settle(self, store: CellStore) -> CellSnapshot:
        assert self.replica.wait_for(store.read_snapshot().revision, timeout=30)
        self.replica.stop()
        return self.replica.snapshot()


def _cell(kv: KV, cell: str) -> CellStore:
    store = CellStore(kv, cell)
    store.add_machines([machine(f"m{i:05}", cpu=8, mem=32) for i in range(MACHINES)])
    store.submit_job(job("huge", tasks=TASKS, cpu=1, mem=1, gang=True))
    return store


def _assert_clean(snap: CellSnapshot, placed: int) -> None:
    assert placed_tasks_of(snap, "huge") == placed
    assert len(snap.gangs) == 0
    assert not any(a.gang or a.evicted_by for m in snap.machines.values()
                   for a in m.allocations.values())
    assert not any(t.gang for t in snap.tasks.values())
    assert violations(snap) == []


def test_ten_thousand_task_gang_commits_atomically(etcd_kv: KV) -> None:
    store = _cell(etcd_kv, "gang-ok")
    observer = Observer(etcd_kv, "gang-ok")
    res = store.commit(Transaction("batch", gang_claims(MACHINES, TASKS, "huge"), TxnMode.GANG))
    assert res.ok and len(res.committed) == TASKS
    final = observer.settle(store)
    assert set(observer.counts) == {0, TASKS}, "a reader saw part of the gang"
    _assert_clean(final, TASKS)


def _run_and_kill(endpoint: str, cell: str, kill_when) -> bool:  # type: ignore[no-untyped-def]
    """Start a committer process; SIGKILL it as soon as ``kill_when(event)`` says so.
    Returns whether the kill happened before the process finished on its own."""
    watch_kv = EtcdKV([endpoint])
    root = f"/omega/{cell}/".encode()
    watcher = watch_kv.watch(root, root[:-1] + b"0", start_revision=0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.gang_proc", endpoint, cell,
         str(MACHINES), str(TASKS), str(TTL)],
        stdout=subprocess.PIPE, text=True,
    )
    killed = False
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not killed:
            resp = watcher.next(timeout=0.1)
            if resp is not None and any(kill_when(e) for e in resp.events):
                proc.kill()
                killed = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        watcher.cancel()
        watch_kv.close()
    return killed


def test_committer_killed_before_the_commit_point_leaves_nothing(
    etcd_kv: KV, etcd_server: EtcdServer
) -> None:
    cell = "gang-kill-early"
    store = _cell(etcd_kv, cell)
    observer = Observer(etcd_kv, cell)
    staged = 0

    def after_600_staged_machines(event) -> bool:  # type: ignore[no-untyped-def]
        nonlocal staged
        if b"/machines/" in event.kv.key and event.type is EventType.PUT:
            staged += 1
        assert b'"committed"' not in event.kv.value, "reached the commit point before the kill"
        return staged >= 600

    assert _run_and_kill(etcd_server.endpoint, cell, after_600_staged_machines)
    mid = store.read_snapshot()
    assert placed_tasks_of(mid, "huge") == 0
    assert violations(mid) == []  # staged holds count, so nothing is over-committed
    # The dead committer's lease lapses (TTL seconds after its last keep-alive), taking
    # its gang record: waited for, not slept for (a fixed TTL + 2.5 s before).
    deadline = time.monotonic() + TTL + 30
    while store.read_snapshot().gangs and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(store.read_snapshot().gangs) == 0
    # A starting server recovers only when its replica's copy shows something to settle.
    assert CellStore.needs_recovery(store.read_snapshot())
    assert store.recover(), "recovery found the orphaned holds"
    assert not CellStore.needs_recovery(store.read_snapshot())
    final = observer.settle(store)
    assert set(observer.counts) == {0}
    _assert_clean(final, 0)
    assert not any(t.job == "huge" for t in final.tasks.values())


def test_committer_killed_after_the_commit_point_leaves_everything(
    etcd_kv: KV, etcd_server: EtcdServer
) -> None:
    cell = "gang-kill-late"
    store = _cell(etcd_kv, cell)
    observer = Observer(etcd_kv, cell)

    def at_commit_point(event) -> bool:  # type: ignore[no-untyped-def]
        return b"/gangs/" in event.kv.key and b'"committed"' in event.kv.value

    assert _run_and_kill(etcd_server.endpoint, cell, at_commit_point)
    mid = store.read_snapshot()
    assert placed_tasks_of(mid, "huge") == TASKS
    assert violations(mid) == []
    time.sleep(TTL + 1)  # a committed gang's record has no lease: it must survive
    assert len(store.read_snapshot().gangs) == 1
    assert CellStore.needs_recovery(store.read_snapshot())
    assert store.recover()
    assert not CellStore.needs_recovery(store.read_snapshot())
    final = observer.settle(store)
    assert set(observer.counts) == {0, TASKS}
    _assert_clean(final, TASKS)
