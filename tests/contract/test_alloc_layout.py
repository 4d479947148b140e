"""The allocation keys' layout (cellstate/keys.py), against etcd and the memory backend:
keys named after the machine's sequence before the write, so that a store refreshing a
machine it holds reads only what was written since, however busy the machine is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cellstate import codec
from cellstate.invariants import layout_violations
from cellstate.keys import KeyKind, Keyspace, split_alloc
from cellstate.kv.base import KV, Compare, Get, KeyValue, Op, Put, TxnResult, range_all
from cellstate.model import (
    Allocation,
    Claim,
    ModelError,
    Resources,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.replica import Replica
from cellstate.store import CellStore, StoreOptions
from schedulers.testing import job, machine, make_cell

K = Keyspace()


class ReadsSeen:
    """Counts, for the read-only transactions sent, the allocation keys the ranges
    they read span: what any backend goes through to answer them."""

    def __init__(self, inner: KV) -> None:
        self.inner = inner
        self.alloc_keys_spanned = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        res = self.inner.txn(compares, success, failure)
        if not compares:
            for op in success:
                kind = K.classify(op.key) if isinstance(op, Get) else None
                if isinstance(op, Get) and kind is not None and kind[0] is KeyKind.ALLOC:
                    self.alloc_keys_spanned += self.inner.range(
                        op.key, op.range_end, revision=res.revision).count
        return res


def _stored(kv: KV) -> list[KeyValue]:
    return list(range_all(kv, K.root).kvs)


def _alloc_keys(kv: KV, mid: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in _stored(kv):
        kind = K.classify(item.key)
        if kind is not None and kind[0] is KeyKind.ALLOC:
            m, seq, tid = split_alloc(kind[1])
            if m == mid:
                out.setdefault(tid, []).append(seq)
    return out


def _place(store: CellStore, jid: str, first: int, count: int, mid: str,
           scheduler: str = "batch") -> int:
    seq = store.read_snapshot().machines[mid].seq
    res = store.commit(Transaction(scheduler, tuple(
        Claim(jid, i, mid, seq) for i in range(first, first + count)), TxnMode.INCREMENTAL))
    assert len(res.committed) == count, res.rejected
    return res.revision


def test_an_allocation_is_stored_under_the_machines_sequence_before_the_write(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("j", tasks=3, cpu=0.1)])
    before = store.read_snapshot().machines["m1"].seq
    _place(store, "j", 0, 2, "m1")
    after = store.read_snapshot().machines["m1"].seq
    _place(store, "j", 2, 1, "m1")
    assert _alloc_keys(kv, "m1") == {"j/0": [before], "j/1": [before], "j/2": [after]}
    snap = store.read_snapshot()
    assert {t: a.key_seq for t, a in snap.machines["m1"].allocations.items()} == {
        "j/0": before, "j/1": before, "j/2": after}
    assert layout_violations(K, _stored(kv)) == []


def test_a_store_refreshing_a_busy_machine_reads_only_what_changed(kv: KV) -> None:
    seen = ReadsSeen(kv)
    make_cell(kv, [machine("m1", cpu=64, mem=256)], [job("j", tasks=40, cpu=0.1, mem=1),
                                           job("k", tasks=2, cpu=0.1)])
    other = CellStore(kv)
    _place(other, "j", 0, 30, "m1")
    mine = CellStore(seen, options=StoreOptions(refresh_when_contended=True))
    mine.load()
    stale = mine.view.machines["m1"].seq
    _place(other, "j", 30, 2, "m1")  # two more since ``mine`` looked
    seen.alloc_keys_spanned = 0
    res = mine.commit(Transaction("batch", (Claim("k", 0, "m1", stale),), TxnMode.INCREMENTAL))
    assert len(res.committed) == 1
    # The read spans the two placed since, not the 32 the machine holds.
    assert seen.alloc_keys_spanned == 2
    assert len(mine.view.machines["m1"].allocations) == 33
    assert mine.view.machines["m1"].allocations == other.read_snapshot().machines["m1"].allocations


def test_a_store_that_missed_a_release_reads_the_machine_whole(kv: KV) -> None:
    make_cell(kv, [machine("m1", cpu=64, mem=256)], [job("j", tasks=5, cpu=0.1, mem=1),
                                           job("k", tasks=1, cpu=0.1)])
    other = CellStore(kv)
    _place(other, "j", 0, 5, "m1")
    mine = CellStore(kv)
    mine.load()
    stale = mine.view.machines["m1"].seq
    other.release_task("j/0", TaskState.FINISHED, "m1")
    res = mine.commit(Transaction("batch", (Claim("k", 0, "m1", stale),), TxnMode.INCREMENTAL))
    assert len(res.committed) == 1
    held = mine.view.machines["m1"].allocations
    assert "j/0" not in held and set(held) == {"j/1", "j/2", "j/3", "j/4", "k/0"}
    assert layout_violations(K, _stored(kv)) == []


@pytest.mark.broken_cell
def test_layout_violations_name_each_break(kv: KV) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=2, cpu=0.1)])
    _place(store, "j", 0, 1, "m1")
    m1 = store.read_snapshot().machines["m1"]
    a = Allocation("j/0", "j", "batch", 0, Resources.of(cpu=0.1))
    value = codec.encode_alloc(a)
    kv.txn([], [
        # j/0 again under a later sequence, the old key left behind
        Put(K.alloc("m1", m1.seq, "j/0"), value),
        # a key of a machine with no record
        Put(K.alloc("m9", 1, "j/1"), value),
        # a key named after a sequence the machine had not reached
        Put(K.alloc("m2", 10**9, "j/1"), value),
    ])
    found = layout_violations(K, _stored(kv))
    assert "task j/0 has 2 allocation keys on m1" in found
    assert "machine m1's record counts 1 allocation(s), 2 are stored" in found
    assert "machine m9 has no record but 1 allocation key(s)" in found
    assert any("names sequence 1000000000" in v for v in found)
    assert "machine m2's record counts 0 allocation(s), 1 are stored" in found


def test_a_replica_following_a_staged_gang_holds_each_allocation_under_its_key(kv: KV) -> None:
    """Settling a large gang changes every allocation it staged (the gang tag goes):
    each moves to a key under the settling write's sequence, deleted and put in one
    revision, and a replica applying the events in order ends with the stored ones."""
    n_machines, n_tasks = 20, 120
    store = make_cell(kv, [machine(f"m{i}", cpu=8) for i in range(n_machines)],
                      [job("big", tasks=n_tasks, cpu=0.5)])
    replica = Replica(kv)
    replica.load()
    per = n_tasks // n_machines
    snap = store.read_snapshot()
    res = store.commit(Transaction("batch", tuple(
        Claim("big", i, f"m{i // per}", snap.machines[f"m{i // per}"].seq)
        for i in range(n_tasks)), TxnMode.GANG))
    assert res.ok and res.attempts > 2  # staged, then settled
    while replica.revision < res.revision or replica.pump(timeout=0.2):
        replica.pump(timeout=0.2)
    stored = store.read_snapshot()
    followed = replica.snapshot()
    for mid, m in stored.machines.items():
        seqs = {t: a.key_seq for t, a in m.allocations.items()}
        assert {t: a.key_seq for t, a in followed.machines[mid].allocations.items()} == seqs
        assert followed.machines[mid].allocations == m.allocations
        assert not any(a.gang for a in m.allocations.values())
    assert layout_violations(K, _stored(kv)) == []
    replica.stop()


@pytest.mark.broken_cell
def test_a_cell_in_the_layout_before_is_refused_with_a_clear_error(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("j")])
    a = Allocation("j/0", "j", "batch", 0, Resources.of(cpu=1, mem=1))
    kv.txn([], [Put(K.allocs("m1") + b"j/0", codec.encode_alloc(a))])  # no <seq>/
    with pytest.raises(ModelError, match=r"allocs/m1/j/0 is not .*recreate the cell"):
        store.read_snapshot()
    assert "recreate the cell" in " ".join(layout_violations(K, _stored(kv)))
