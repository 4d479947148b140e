"""The server's reaper: a machine whose agent's lease lapsed goes down and its tasks
are lost, while a machine whose agent lives is left alone. Seconds, not minutes: the
end-to-end test (tests/e2e/test_processes.py) kills a real agent process; here the
lease lapses on its own, on a manual clock over the in-memory KV and on a real etcd
with a 1 s lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from cellstate.api.server import Reaper
from cellstate.cell import CellSnapshot, task_view
from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, MachineState, TaskState, Transaction
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.testing import Clock, job, machine

# How long to wait for an event before calling the test failed (never reached when
# the reaper works; a bound, not a measurement).
EVENT_TIMEOUT = 30.0


def _cell(kv: KV, short_ttl: int) -> CellStore:
    """Agent ``a`` (machine m0, short lease, never renewed) runs j/0; agent ``b``
    (machine m1, a long lease) runs j/1."""
    store = CellStore(kv, "reap")
    store.submit_job(job("j", tasks=2))
    store.register_agent("a", [machine("m0")], short_ttl)
    store.register_agent("b", [machine("m1")], 600)
    res = store.commit(Transaction("batch", (Claim("j", 0, "m0"), Claim("j", 1, "m1"))))
    assert not res.rejected
    return store


@contextmanager
def _reaping(kv: KV) -> Iterator[tuple[Replica, Reaper, threading.Event]]:
    """A replica and a reaper over the cell, stopped however the test ends; the event
    is set on every change the replica applies."""
    replica = Replica(kv, "reap")
    changed = threading.Event()
    replica.on_changes(lambda snap, changes: changed.set())
    reaper = Reaper(kv, "reap", replica, interval=0.05)
    replica.start()
    try:
        reaper.start()
        yield replica, reaper, changed
    finally:
        reaper.stop()
        replica.stop()


def _wait(what: str, replica: Replica, changed: threading.Event,
          done: Callable[[CellSnapshot], bool], poke: Callable[[], object] = lambda: None,
          ) -> CellSnapshot:
    deadline = time.monotonic() + EVENT_TIMEOUT
    while True:
        changed.clear()
        snap = replica.snapshot()
        if done(snap):
            return snap
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {EVENT_TIMEOUT:g} s")
        poke()
        changed.wait(0.1)


def _check_reaped(snap: CellSnapshot) -> None:
    assert snap.machines["m0"].state is MachineState.DOWN
    assert not snap.machines["m0"].allocations
    assert task_view(snap, "j/0").state is TaskState.LOST
    assert snap.machines["m1"].state is MachineState.UP
    assert task_view(snap, "j/1").state is TaskState.RUNNING


def test_a_lapsed_lease_takes_its_machines_down_on_a_manual_clock() -> None:
    clock = Clock()
    kv = MemoryKV(clock=clock)
    _cell(kv, short_ttl=5)
    with _reaping(kv) as (replica, reaper, changed):
        snap = replica.snapshot()
        assert reaper.orphans(snap) == []
        clock.now += 6
        _ = kv.revision  # the in-memory KV expires leases when it is next used
        _check_reaped(_wait("machine m0 down", replica, changed,
                            lambda s: s.machines["m0"].state is MachineState.DOWN))
        assert reaper.orphans(replica.snapshot()) == []


def test_orphans_are_the_machines_of_agents_without_a_key() -> None:
    """The reaper's selection on its own: the machines of a gone agent; never a
    machine of a live agent or one with no agent."""
    clock = Clock()
    kv = MemoryKV(clock=clock)
    store = _cell(kv, short_ttl=5)
    store.add_machine(machine("m2"))  # no agent: an operator's machine
    replica = Replica(kv, "reap")
    reaper = Reaper(kv, "reap", replica)
    replica.load()
    assert reaper.orphans(replica.snapshot()) == []
    clock.now += 6
    replica.load()
    assert reaper.orphans(replica.snapshot()) == ["m0"]
    assert store.machine_lost("m0")
    replica.load()
    assert reaper.orphans(replica.snapshot()) == []
    _check_reaped(replica.snapshot())


@pytest.mark.etcd
def test_a_lapsed_etcd_lease_takes_its_machines_down(etcd_kv: KV) -> None:
    _cell(etcd_kv, short_ttl=1)
    with _reaping(etcd_kv) as (replica, _, changed):
        _check_reaped(_wait("machine m0 down", replica, changed,
                            lambda s: s.machines["m0"].state is MachineState.DOWN))
