"""Synced local copies (cellstate/replica.py) on both backends."""

from __future__ import annotations

import attrs
import pytest

from cellstate.cell import CellSnapshot
from cellstate.invariants import placed_tasks_of
from cellstate.kv.base import KV, range_all
from cellstate.kv.etcd import EtcdKV
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim
from cellstate.replica import Replica, snapshot_from_kvs
from schedulers.testing import job, machine, make_cell, txn


def pump_until(replica: Replica, revision: int) -> None:
    for _ in range(100):
        replica.pump(timeout=0.1)
        if replica.revision >= revision:
            return
    raise AssertionError(f"replica stuck at {replica.revision}, wanted {revision}")


def test_replica_follows_commits_and_snapshots_do_not_change(kv: KV) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=4)])
    replica = Replica(kv)
    r0 = replica.load()
    before = replica.snapshot()
    assert before.revision == r0 and set(before.machines) == {"m1", "m2"}
    res = store.commit(txn([Claim("j", 0, "m1"), Claim("j", 1, "m2")]))
    pump_until(replica, res.revision)
    after = replica.snapshot()
    assert after.revision == res.revision
    assert placed_tasks_of(after, "j") == 2
    assert placed_tasks_of(before, "j") == 0  # an old snapshot is never touched
    assert before.machines["m1"].allocations == {}
    assert replica.verify() == []
    replica.stop()


def test_replica_applies_each_revision_whole(kv: KV) -> None:
    store = make_cell(kv, [machine(f"m{i}") for i in range(5)], [job("j", tasks=5)])
    replica = Replica(kv)
    replica.load()
    seen: list[tuple[int, int]] = []
    replica.on_change(lambda s: seen.append((s.revision, placed_tasks_of(s, "j"))))
    res = store.commit(txn([Claim("j", i, f"m{i}") for i in range(5)]))
    pump_until(replica, res.revision)
    assert seen[-1] == (res.revision, 5)
    assert all(count in (0, 5) for _, count in seen)
    replica.stop()


def test_lag_reports_what_the_replica_has_not_applied(kv: KV) -> None:
    now = [100.0]
    store = make_cell(kv, [machine("m1")], [job("j", tasks=3)])
    replica = Replica(kv, clock=lambda: now[0])
    replica.load()
    now[0] += 5
    assert replica.lag().seconds_since_confirmed == pytest.approx(5)
    res = store.commit(txn([Claim("j", 0, "m1")]))
    replica.request_progress()
    pump_until(replica, res.revision)
    lag = replica.lag()
    assert lag.applied_revision == res.revision and lag.revisions_behind == 0
    assert lag.seconds_since_confirmed == 0
    replica.stop()


def test_replica_in_a_thread_can_be_waited_on(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("j")])
    with Replica(kv) as replica:
        res = store.commit(txn([Claim("j", 0, "m1")]))
        assert replica.wait_for(res.revision, timeout=10)
        assert placed_tasks_of(replica.snapshot(), "j") == 1


def _break_stream(kv: KV, restart: object = None) -> None:
    if isinstance(kv, MemoryKV):
        kv.drop_watches()
    else:
        restart()  # type: ignore[operator]


def _resume_case(kv: KV, restart: object) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=4)])
    replica = Replica(kv, retry_delay=0.05)
    replica.load()
    store.commit(txn([Claim("j", 0, "m1")]))
    _break_stream(kv, restart)
    res = store.commit(txn([Claim("j", 1, "m2")]))
    pump_until(replica, res.revision)
    assert placed_tasks_of(replica.snapshot(), "j") == 2
    assert replica.resumes >= 1 and replica.reloads == 0
    assert replica.verify() == []
    replica.stop()


def _compaction_case(kv: KV, restart: object) -> None:
    store = make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=4)])
    replica = Replica(kv, retry_delay=0.05)
    replica.load()
    _break_stream(kv, restart)
    store.commit(txn([Claim("j", 0, "m1")]))
    res = store.commit(txn([Claim("j", 1, "m2")]))
    kv.compact(res.revision)
    pump_until(replica, res.revision)
    assert replica.reloads == 1
    assert placed_tasks_of(replica.snapshot(), "j") == 2
    assert replica.verify() == []
    replica.stop()


def test_memory_replica_resumes_after_a_dropped_stream() -> None:
    _resume_case(MemoryKV(), None)


def test_memory_replica_reloads_after_compaction() -> None:
    _compaction_case(MemoryKV(), None)


@pytest.mark.etcd
def test_etcd_replica_resumes_after_the_server_restarts(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    kv = EtcdKV([fresh_etcd.endpoint])
    try:
        _resume_case(kv, fresh_etcd.restart)
    finally:
        kv.close()


@pytest.mark.etcd
def test_etcd_replica_reloads_after_compaction(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    kv = EtcdKV([fresh_etcd.endpoint])
    try:
        _compaction_case(kv, fresh_etcd.restart)
    finally:
        kv.close()


def test_a_store_following_a_replica_commits_without_stale_guards(kv: KV) -> None:
    from cellstate.store import CellStore

    admin = make_cell(kv, [machine("m1", cpu=8)], [job("j", tasks=4)])
    follower = CellStore(kv)
    replica = Replica(kv)
    replica.load()
    follower.follow(replica)
    assert follower.commit(txn([Claim("j", 0, "m1")])).attempts == 1
    res = admin.commit(txn([Claim("j", 1, "m1")]))  # the follower's copy of m1 is now stale
    pump_until(replica, res.revision)
    assert follower.commit(txn([Claim("j", 2, "m1")])).attempts == 1  # learnt, no retry
    blind = CellStore(kv)
    blind.load()
    admin.commit(txn([Claim("j", 3, "m1")]))
    stale = blind.commit(txn([Claim("j", 3, "m1")]))
    assert stale.attempts == 2 and stale.rejected[0].reason.value == "task_already_placed"
    replica.stop()


def _as_read(snap: CellSnapshot) -> dict[str, object]:
    """Every machine and task record with every field a reader decodes (the fields
    left out of equality too: allocations' keys, tasks' times and histories)."""
    out: dict[str, object] = {}
    for mid, m in snap.machines.items():
        out[f"machine {mid}"] = (m, m.seq, {t: (a, a.key_seq) for t, a in m.allocations.items()})
    for tid, t in snap.tasks.items():
        out[f"task {tid}"] = (t, t.placed_at, t.history)
    return out


def test_a_store_following_a_replica_hands_it_the_records_it_wrote(kv: KV) -> None:
    """The records a store following a replica made durable are taken by the replica
    off the watch as they are (not decoded again), and are exactly what decoding
    would give: a fresh read at the same revision finds the same cell."""
    from cellstate.store import CellStore

    admin = make_cell(kv, [machine(f"m{i}", cpu=8) for i in range(4)],
                      [job("j", tasks=12), job("k", tasks=4)])
    writer = CellStore(kv, clock=lambda: 1234.56789)  # stamps below the stored precision
    replica = Replica(kv)
    replica.load()
    writer.follow(replica)
    writer.commit(txn([Claim("j", i, f"m{i % 4}") for i in range(8)]))
    res = writer.commit_many([txn([Claim("j", i, f"m{i % 4}") for i in range(8, 12)]),
                              txn([Claim("k", i, f"m{i}") for i in range(4)])])
    pump_until(replica, res[-1].revision)
    assert replica.known_taken >= 20  # 16 tasks, 4 machines (at least at their last write)
    snap = replica.snapshot()
    fresh = snapshot_from_kvs(replica.keys, range_all(kv, replica.keys.root,
                                                      revision=snap.revision).kvs,
                              snap.revision)
    assert _as_read(snap) == _as_read(fresh)
    assert snap.tasks["j/0"].placed_at == 1234.568
    admin.commit(txn([Claim("j", 0, "m1")]))  # not a writer the replica follows
    replica.stop()


def test_a_record_expected_with_another_value_or_base_is_decoded(kv: KV) -> None:
    """``Replica.expect`` is matched by value: a record expected with another value
    than the watch brings, or a machine written over another revision than the one
    the replica holds (a failed write's, say) or with other allocations, is decoded
    from etcd's value instead."""
    from cellstate.store import CellStore

    store = make_cell(kv, [machine(f"m{i}") for i in range(4)], [job("j", tasks=4)])
    replica = Replica(kv)
    replica.load()
    keys = replica.keys
    base = {mid: m.seq for mid, m in replica.snapshot().machines.items()}
    res = store.commit(txn([Claim("j", i, f"m{i}") for i in range(4)]))
    stored = {x.key: x.value for x in range_all(kv, keys.root).kvs}
    allocs = {k: v for k, v in stored.items() if k.startswith(keys.root + b"allocs/")}
    written = CellStore(kv)
    written.load()
    m = written.view.machines
    t0 = written.view.tasks["j/0"]
    replica.expect({
        keys.machine("m0"): (stored[keys.machine("m0")], m["m0"].with_allocations({}),
                             allocs, base["m0"]),  # its allocation missing
        keys.machine("m1"): (stored[keys.machine("m1")], m["m1"], allocs,
                             base["m1"] + 1),  # written over another revision
        keys.machine("m2"): (stored[keys.machine("m2")], m["m2"], {},
                             base["m2"]),  # its allocation's value not the one put
        keys.machine("m3"): (stored[keys.machine("m3")], m["m3"], allocs,
                             base["m3"]),  # right: taken
        keys.task_key("j/1"): (stored[keys.task_key("j/1")],
                               attrs.evolve(t0, index=1, detail="planted"), None, 0),  # taken
        keys.task_key("j/0"): (b'{"state":"running"}', attrs.evolve(t0, detail="x"), None, 0),
    })
    pump_until(replica, res.revision)
    snap = replica.snapshot()
    assert replica.known_taken == 2
    for mid in ("m0", "m1", "m2"):
        assert set(snap.machines[mid].allocations) == {f"j/{mid[1]}"}
        assert snap.machines[mid].allocations is not m[mid].allocations  # decoded
    assert snap.machines["m3"] == m["m3"] and snap.machines["m3"].seq == res.revision
    assert snap.machines["m3"].allocations is m["m3"].allocations
    assert snap.tasks["j/0"].detail == "" and snap.tasks["j/1"].detail == "planted"
    replica.stop()


def test_records_expected_but_never_seen_are_dropped_oldest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's failed writes leave records the watch never brings: the replica keeps
    at most EXPECTED_MAX of them, dropping the oldest."""
    import cellstate.replica as replica_module

    monkeypatch.setattr(replica_module, "EXPECTED_MAX", 10)
    replica = Replica(MemoryKV())
    for i in range(25):
        replica.expect({b"k%02d" % i: (b"v", None, None, 0)})
    held = list(replica._expected)
    assert len(held) <= 10 and held[-1] == b"k24" and b"k00" not in held
