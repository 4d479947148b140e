"""Transactions bigger than one backend transaction allows, in bytes rather than ops:
incremental ones are split, gang ones go through the staged protocol."""

from __future__ import annotations

from cellstate.invariants import placed_tasks_of, violations
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim
from schedulers.testing import job, machine, make_cell, txn


def _crowded_cell(kv: MemoryKV):  # type: ignore[no-untyped-def]
    """Ten machines, each with 60 small tasks on it."""
    store = make_cell(kv, [machine(f"m{i}", cpu=100, mem=1000) for i in range(10)],
                      [job("filler", tasks=600, cpu=0.1, mem=0.1), job("new", tasks=20)])
    for i in range(10):
        assert store.commit(txn([Claim("filler", i * 60 + k, f"m{i}") for k in range(60)])).ok
    return store


def test_incremental_transaction_over_the_byte_limit_is_split() -> None:
    kv = MemoryKV(max_request_bytes=4_000)
    store = _crowded_cell(kv)
    res = store.commit(txn([Claim("new", i, f"m{i % 10}") for i in range(20)]))
    assert res.ok and res.attempts >= 2
    assert placed_tasks_of(store.read_snapshot(), "new") == 20


def test_gang_over_the_byte_limit_commits_through_staging() -> None:
    kv = MemoryKV(max_request_bytes=4_000)
    store = _crowded_cell(kv)
    res = store.commit(txn([Claim("new", i, f"m{i % 10}") for i in range(20)], gang=True))
    assert res.ok
    snap = store.read_snapshot()
    assert placed_tasks_of(snap, "new") == 20
    assert len(snap.gangs) == 0 and violations(snap) == []


def test_bytes_written_per_placement_do_not_grow_with_the_machine() -> None:
    """A placement writes its task's allocation and record and the machine's small
    record, whatever the machine already holds (issue 9: machine records used to carry
    every allocation, so each placement rewrote them all)."""
    kv = MemoryKV()
    store = make_cell(kv, [machine(f"m{i}", cpu=1000, mem=1000) for i in range(3)],
                      [job("filler", tasks=110, cpu=0.1, mem=0.1), job("new", tasks=3)])
    filler = iter(range(110))
    for i, held in enumerate((0, 10, 100)):
        claims = [Claim("filler", next(filler), f"m{i}") for _ in range(held)]
        if claims:
            assert store.commit(txn(claims)).ok
    written = []
    for i in range(3):  # the bytes of the puts at the placement's revision
        rev = store.commit(txn([Claim("new", i, f"m{i}")])).revision
        written.append(sum(len(e.kv.key) + len(e.kv.value)
                           for e in _events_at(kv, rev)))
    assert max(written) <= 1.2 * min(written), written


def _events_at(kv: MemoryKV, revision: int):  # type: ignore[no-untyped-def]
    w = kv.watch(b"/", b"\xff", start_revision=revision)
    try:
        got = w.next(timeout=1.0)
        assert got is not None
        return [e for e in got.events if e.kv.mod_revision == revision]
    finally:
        w.cancel()
