"""The key-value contract (cellstate/kv/base.py), run unchanged against both backends."""

from __future__ import annotations

import time

import pytest

from cellstate.kv.base import (
    KV,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Delete,
    DuplicateKeyError,
    EventType,
    Get,
    Put,
    TxnTooLargeError,
    Watcher,
    WatchResponse,
    prefix_end,
    range_all,
)


def put(kv: KV, key: bytes, value: bytes) -> int:
    return kv.txn([], [Put(key, value)]).revision


def drain(watcher: Watcher, want: int, timeout: float = 5.0) -> list[WatchResponse]:
    got: list[WatchResponse] = []
    deadline = time.monotonic() + timeout
    while sum(len(r.events) for r in got) < want and time.monotonic() < deadline:
        r = watcher.next(timeout=0.2)
        if r is not None and r.events:
            got.append(r)
    return got


def test_each_write_advances_the_revision_by_one(kv: KV) -> None:
    r1 = put(kv, b"/t/a", b"1")
    r2 = kv.txn([], [Put(b"/t/b", b"2"), Put(b"/t/c", b"3")]).revision
    assert r2 == r1 + 1
    res = kv.range(b"/t/", prefix_end(b"/t/"))
    assert [kv_.key for kv_ in res.kvs] == [b"/t/a", b"/t/b", b"/t/c"]
    assert {kv_.mod_revision for kv_ in res.kvs[1:]} == {r2}
    assert res.revision == r2


def test_create_mod_and_version_follow_etcd(kv: KV) -> None:
    r1 = put(kv, b"/t/k", b"1")
    r2 = put(kv, b"/t/k", b"2")
    (k,) = kv.range(b"/t/k").kvs
    assert (k.create_revision, k.mod_revision, k.version, k.value) == (r1, r2, 2, b"2")
    kv.txn([], [Delete(b"/t/k")])
    r4 = put(kv, b"/t/k", b"3")
    (k,) = kv.range(b"/t/k").kvs
    assert (k.create_revision, k.version) == (r4, 1)


def test_a_write_that_changes_nothing_keeps_the_revision(kv: KV) -> None:
    r = put(kv, b"/t/x", b"1")
    res = kv.txn([], [Delete(b"/t/absent")])
    assert res.revision == r and res.responses == (0,)
    assert kv.txn([], [Get(b"/t/x")]).revision == r


def test_compare_on_an_absent_key_sees_zero_revisions(kv: KV) -> None:
    ok = kv.txn([Compare.absent(b"/t/new")], [Put(b"/t/new", b"v")])
    assert ok.succeeded
    again = kv.txn([Compare.absent(b"/t/new")], [Put(b"/t/new", b"w")], [Get(b"/t/new")])
    assert not again.succeeded
    (found,) = again.responses
    assert isinstance(found, tuple) and found[0].value == b"v"
    value_cmp = Compare(b"/t/none", CompareTarget.VALUE, CompareResult.EQUAL, b"")
    assert not kv.txn([value_cmp], []).succeeded


def test_guarded_txn_fails_after_a_concurrent_write(kv: KV) -> None:
    r = put(kv, b"/t/m", b"a")
    put(kv, b"/t/m", b"b")
    res = kv.txn([Compare.mod_revision_is(b"/t/m", r)], [Put(b"/t/m", b"c")], [Get(b"/t/m")])
    assert not res.succeeded
    (fresh,) = res.responses
    assert isinstance(fresh, tuple) and fresh[0].value == b"b"
    assert kv.range(b"/t/m").kvs[0].value == b"b"


def test_value_and_version_compares(kv: KV) -> None:
    put(kv, b"/t/v", b"hello")
    eq = Compare(b"/t/v", CompareTarget.VALUE, CompareResult.EQUAL, b"hello")
    gt = Compare(b"/t/v", CompareTarget.VERSION, CompareResult.GREATER, 0)
    lt = Compare(b"/t/v", CompareTarget.VERSION, CompareResult.LESS, 1)
    assert kv.txn([eq, gt], []).succeeded
    assert not kv.txn([lt], []).succeeded


def test_too_many_ops_is_refused_whole(kv: KV) -> None:
    before = kv.range(b"/t/", prefix_end(b"/t/")).revision
    too_many = [Put(f"/t/{i}".encode(), b"v") for i in range(kv.max_txn_ops + 1)]
    with pytest.raises(TxnTooLargeError):
        kv.txn([], too_many)
    assert kv.range(b"/t/", prefix_end(b"/t/")).kvs == ()
    # The limit applies per list, not to the sum of compares and ops.
    n = kv.max_txn_ops
    fits = kv.txn(
        [Compare.absent(f"/t/c{i}".encode()) for i in range(n)],
        [Put(f"/t/{i}".encode(), b"v") for i in range(n)],
    )
    assert fits.succeeded and fits.revision == before + 1


def test_oversized_request_is_refused(kv: KV) -> None:
    with pytest.raises(TxnTooLargeError):
        kv.txn([], [Put(b"/t/big", b"x" * (kv.max_request_bytes + 1024))])
    assert kv.range(b"/t/big").kvs == ()


def test_duplicate_key_in_one_txn_is_refused(kv: KV) -> None:
    with pytest.raises(DuplicateKeyError):
        kv.txn([], [Put(b"/t/d", b"1"), Put(b"/t/d", b"2")])
    assert kv.range(b"/t/d").kvs == ()


def test_read_at_a_past_revision_and_compaction(kv: KV) -> None:
    r1 = put(kv, b"/t/h", b"1")
    r2 = put(kv, b"/t/h", b"2")
    assert kv.range(b"/t/h", revision=r1).kvs[0].value == b"1"
    kv.compact(r2)
    with pytest.raises(CompactedError):
        kv.range(b"/t/h", revision=r1)
    assert kv.range(b"/t/h", revision=r2).kvs[0].value == b"2"


def test_paged_range_reads_everything_at_one_revision(kv: KV) -> None:
    kv.txn([], [Put(f"/t/p/{i:03}".encode(), b"v") for i in range(100)])
    res = range_all(kv, b"/t/p/", page=7)
    assert len(res.kvs) == 100
    assert [k.key for k in res.kvs] == sorted(k.key for k in res.kvs)


def test_watch_replays_history_grouped_by_revision(kv: KV) -> None:
    start = put(kv, b"/t/w/a", b"1")
    r2 = kv.txn([], [Put(b"/t/w/b", b"2"), Delete(b"/t/w/a")]).revision
    put(kv, b"/t/other", b"x")
    w = kv.watch(b"/t/w/", prefix_end(b"/t/w/"), start_revision=start)
    try:
        got = drain(w, 3)
        revs = [[(e.type, e.kv.key, e.kv.mod_revision) for e in r.events] for r in got]
        assert revs == [
            [(EventType.PUT, b"/t/w/a", start)],
            [(EventType.PUT, b"/t/w/b", r2), (EventType.DELETE, b"/t/w/a", r2)],
        ] or revs == [
            [(EventType.PUT, b"/t/w/a", start)],
            [(EventType.DELETE, b"/t/w/a", r2), (EventType.PUT, b"/t/w/b", r2)],
        ]
    finally:
        w.cancel()


def test_watch_delivers_live_changes(kv: KV) -> None:
    r0 = put(kv, b"/t/x", b"0")
    w = kv.watch(b"/t/live/", prefix_end(b"/t/live/"), start_revision=r0 + 1)
    try:
        r1 = put(kv, b"/t/live/1", b"a")
        got = drain(w, 1)
        assert [(e.kv.key, e.kv.mod_revision) for r in got for e in r.events] == [
            (b"/t/live/1", r1)
        ]
    finally:
        w.cancel()


def test_watch_from_below_compaction_is_cancelled(kv: KV) -> None:
    r1 = put(kv, b"/t/c", b"1")
    r2 = put(kv, b"/t/c", b"2")
    put(kv, b"/t/c", b"3")
    kv.compact(r2 + 1)
    w = kv.watch(b"/t/c", start_revision=r1)
    try:
        deadline = time.monotonic() + 5
        resp = None
        while resp is None and time.monotonic() < deadline:
            resp = w.next(timeout=0.2)
        assert resp is not None and resp.canceled and resp.compact_revision == r2 + 1
    finally:
        w.cancel()


def test_progress_request_reports_the_current_revision(kv: KV) -> None:
    r = put(kv, b"/t/p", b"1")
    w = kv.watch(b"/t/quiet/", prefix_end(b"/t/quiet/"), start_revision=r + 1)
    try:
        w.request_progress()
        deadline = time.monotonic() + 5
        resp = None
        while time.monotonic() < deadline:
            resp = w.next(timeout=0.2)
            if resp is not None:
                break
        assert resp is not None and resp.is_progress and resp.revision >= r
    finally:
        w.cancel()


def test_revoking_a_lease_deletes_its_keys_in_one_revision(kv: KV) -> None:
    lease = kv.lease_grant(30)
    kv.txn([], [Put(b"/t/l/1", b"a", lease), Put(b"/t/l/2", b"b", lease), Put(b"/t/l/3", b"c")])
    assert kv.lease_keepalive(lease) > 0
    before = kv.range(b"/t/l/3").revision
    kv.lease_revoke(lease)
    res = kv.range(b"/t/l/", prefix_end(b"/t/l/"))
    assert [k.key for k in res.kvs] == [b"/t/l/3"]
    assert res.revision == before + 1


def test_put_without_lease_detaches_the_key(kv: KV) -> None:
    lease = kv.lease_grant(30)
    kv.txn([], [Put(b"/t/keep", b"a", lease)])
    kv.txn([], [Put(b"/t/keep", b"b")])
    kv.lease_revoke(lease)
    assert kv.range(b"/t/keep").kvs[0].value == b"b"


def test_compare_on_lease_sees_the_keys_current_lease(kv: KV) -> None:
    """The store guards deregistration and metrics on the instance key's lease: a
    leased key compares equal to its lease, an unleased, absent or expired-by-revoke key
    to 0, and a put without a lease detaches it."""
    lease, other = kv.lease_grant(30), kv.lease_grant(30)
    kv.txn([], [Put(b"/t/cl/a", b"1", lease), Put(b"/t/cl/b", b"2")])

    def is_lease(key: bytes, value: int, result: CompareResult = CompareResult.EQUAL) -> bool:
        return kv.txn([Compare(key, CompareTarget.LEASE, result, value)], []).succeeded

    assert is_lease(b"/t/cl/a", lease) and not is_lease(b"/t/cl/a", other)
    assert not is_lease(b"/t/cl/a", 0) and is_lease(b"/t/cl/a", 0, CompareResult.NOT_EQUAL)
    assert is_lease(b"/t/cl/b", 0) and not is_lease(b"/t/cl/b", lease)
    assert is_lease(b"/t/cl/absent", 0) and not is_lease(b"/t/cl/absent", lease)
    # A guarded delete runs only for the holder of the lease.
    res = kv.txn([Compare(b"/t/cl/a", CompareTarget.LEASE, CompareResult.EQUAL, other)],
                 [Delete(b"/t/cl/a")], [Get(b"/t/cl/a")])
    assert not res.succeeded and res.responses[0] and kv.range(b"/t/cl/a").kvs
    kv.txn([], [Put(b"/t/cl/a", b"3")])
    assert is_lease(b"/t/cl/a", 0)
    kv.txn([], [Put(b"/t/cl/a", b"4", other)])
    kv.lease_revoke(other)
    assert is_lease(b"/t/cl/a", 0) and kv.range(b"/t/cl/a").kvs == ()
    kv.lease_revoke(lease)


def test_paged_range_at_a_past_revision_reads_that_revision(kv: KV) -> None:
    kv.txn([], [Put(f"/t/q/{i:03}".encode(), b"old") for i in range(30)])
    at = kv.range(b"/t/q/000").revision
    kv.txn([], [Put(f"/t/q/{i:03}".encode(), b"new") for i in range(30)])
    res = range_all(kv, b"/t/q/", revision=at, page=7)
    assert res.revision == at and {k.value for k in res.kvs} == {b"old"} and len(res.kvs) == 30


def test_nested_transactions_commit_independently_in_one_revision(kv: KV) -> None:
    from cellstate.kv.base import TxnOp, TxnResult

    r0 = put(kv, b"/t/n/a", b"1")
    put(kv, b"/t/n/b", b"1")
    res = kv.txn([], [
        TxnOp((Compare.mod_revision_is(b"/t/n/a", r0),), (Put(b"/t/n/a", b"2"),),
              (Get(b"/t/n/a"),)),
        TxnOp((Compare.mod_revision_is(b"/t/n/b", r0),), (Put(b"/t/n/b", b"2"),),
              (Get(b"/t/n/b"),)),
        TxnOp((Compare.absent(b"/t/n/c"),), (Put(b"/t/n/c", b"new"),)),
    ])
    first, second, third = res.responses
    assert isinstance(first, TxnResult) and isinstance(second, TxnResult)
    assert isinstance(third, TxnResult)
    assert first.succeeded and third.succeeded and not second.succeeded
    (fresh,) = second.responses
    assert isinstance(fresh, tuple) and fresh[0].value == b"1"
    values = {k.key: (k.value, k.mod_revision) for k in
              kv.range(b"/t/n/", prefix_end(b"/t/n/")).kvs}
    assert values == {b"/t/n/a": (b"2", res.revision), b"/t/n/b": (b"1", r0 + 1),
                      b"/t/n/c": (b"new", res.revision)}


def test_get_changed_returns_keys_modified_since_and_counts_the_whole_range(kv: KV) -> None:
    from cellstate.kv.base import GetChanged, RangeResult, TxnOp, TxnResult

    r1 = kv.txn([], [Put(b"/t/g/a", b"1"), Put(b"/t/g/b", b"1"), Put(b"/t/g/c", b"1")]).revision
    r2 = kv.txn([], [Put(b"/t/g/b", b"2"), Put(b"/t/g/d", b"2"), Delete(b"/t/g/c")]).revision
    res = kv.txn([], [GetChanged(b"/t/g/", prefix_end(b"/t/g/"), r1 + 1),
                      GetChanged(b"/t/g/", prefix_end(b"/t/g/"), r1),
                      GetChanged(b"/t/g/a", None, r1 + 1),
                      GetChanged(b"/t/g/a", None, r1),
                      GetChanged(b"/t/g/none", None, 1)])
    since_r2, since_r1, a_unchanged, a_since_r1, absent = res.responses
    assert isinstance(since_r2, RangeResult)
    # The deleted key is not counted; the unchanged one is counted but not returned.
    assert [(k.key, k.value, k.mod_revision) for k in since_r2.kvs] == [
        (b"/t/g/b", b"2", r2), (b"/t/g/d", b"2", r2)]
    assert since_r2.count == 3
    assert isinstance(since_r1, RangeResult)
    assert [k.key for k in since_r1.kvs] == [b"/t/g/a", b"/t/g/b", b"/t/g/d"]
    assert since_r1.count == 3
    assert isinstance(a_unchanged, RangeResult) and isinstance(a_since_r1, RangeResult)
    assert (a_unchanged.kvs, a_unchanged.count) == ((), 1)
    assert [k.value for k in a_since_r1.kvs] == [b"1"] and a_since_r1.count == 1
    assert isinstance(absent, RangeResult) and (absent.kvs, absent.count) == ((), 0)
    # In a nested transaction's failure branch too.
    res = kv.txn([], [TxnOp((Compare.absent(b"/t/g/a"),), (Put(b"/t/g/x", b"x"),),
                            (GetChanged(b"/t/g/", prefix_end(b"/t/g/"), r2),))])
    (nested,) = res.responses
    assert isinstance(nested, TxnResult) and not nested.succeeded
    (got,) = nested.responses
    assert isinstance(got, RangeResult)
    assert [k.key for k in got.kvs] == [b"/t/g/b", b"/t/g/d"] and got.count == 3


def test_a_key_written_in_two_nested_transactions_is_refused(kv: KV) -> None:
    from cellstate.kv.base import TxnOp

    with pytest.raises(DuplicateKeyError):
        kv.txn([], [TxnOp((), (Put(b"/t/d2", b"1"),)), TxnOp((), (Put(b"/t/d2", b"2"),))])
    assert kv.range(b"/t/d2").kvs == ()


def test_a_nested_transaction_gets_only_the_ops_its_parent_leaves(kv: KV) -> None:
    """etcd checks a nested transaction against --max-txn-ops minus the largest list of
    its parent (checkTxnRequest), not against the whole limit."""
    from cellstate.kv.base import TxnOp

    limit = kv.max_txn_ops
    outer = [Put(f"/t/o{i}".encode(), b"x") for i in range(limit - 30)]
    inner = [Put(f"/t/i{i}".encode(), b"x") for i in range(30)]
    before = kv.txn([], [Get(b"/t/o0")]).revision
    with pytest.raises(TxnTooLargeError):
        kv.txn([], [*outer, TxnOp((), tuple(inner))])
    assert kv.txn([], [Get(b"/t/o0")]).revision == before  # nothing written
    assert kv.txn([], [*outer, TxnOp((), tuple(inner[:29]))]).succeeded
