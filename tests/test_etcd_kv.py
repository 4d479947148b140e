"""EtcdKV against a real etcd: what is etcd-specific (the shared contract suite in
tests/contract covers the KV semantics on both backends)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from cellstate.kv.base import (
    CompactedError,
    Compare,
    Delete,
    DuplicateKeyError,
    EventType,
    FutureRevisionError,
    Get,
    KeyValue,
    LeaseNotFoundError,
    Put,
    TxnTooLargeError,
    UnavailableError,
    WatchDroppedError,
    WatchResponse,
    prefix_end,
    range_all,
)
from cellstate.kv.etcd import EtcdAuthError, EtcdKV, EtcdWatcher
from cellstate.kv.etcdpb.authpb import auth_pb2
from cellstate.kv.etcdpb.etcdserverpb import rpc_pb2 as pb, rpc_pb2_grpc as pb_grpc
from omega.etcd_launcher import LocalEtcd
from tests.etcd_fixture import EtcdServer, make_local_etcd

pytestmark = pytest.mark.etcd


def _puts(n: int, prefix: bytes = b"/n/") -> list[Put]:
    return [Put(prefix + b"%04d" % i, b"v") for i in range(n)]


def _next_events(w: EtcdWatcher, timeout: float = 5.0) -> WatchResponse:
    """The next response with events (skipping progress notifications)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        resp = w.next(timeout=remaining)
        if resp is not None and resp.events:
            return resp
    raise AssertionError("no events arrived")


# ------------------------------------------------------------------------ KV calls


def test_txn_results_follow_the_branch_that_ran(etcd_kv: EtcdKV) -> None:
    r1 = etcd_kv.txn([Compare.absent(b"/a")], [Put(b"/a", b"1"), Put(b"/b", b"2")])
    assert r1.succeeded and r1.responses == (None, None)
    r2 = etcd_kv.txn(
        [Compare.absent(b"/a")],
        [Put(b"/a", b"again")],
        [Get(b"/a", prefix_end(b"/a")), Delete(b"/b"), Get(b"/zzz")],
    )
    assert not r2.succeeded
    assert r2.responses == ((KeyValue(b"/a", b"1", r1.revision, r1.revision, 1),), 1, ())
    assert r2.revision == r1.revision + 1  # the delete wrote


def test_range_limit_keys_only_and_count(etcd_kv: EtcdKV) -> None:
    rev = etcd_kv.txn([], _puts(5)).revision
    res = etcd_kv.range(b"/n/", prefix_end(b"/n/"), limit=2, keys_only=True)
    assert [kv.key for kv in res.kvs] == [b"/n/0000", b"/n/0001"]
    assert all(kv.value == b"" for kv in res.kvs)
    assert (res.more, res.count, res.revision) == (True, 5, rev)


def test_ops_beyond_the_launchers_max_txn_ops_are_refused(etcd_kv: EtcdKV) -> None:
    etcd_kv.txn([], _puts(256))  # at the limit omega's launcher sets: fine
    with pytest.raises(TxnTooLargeError, match="too many operations"):
        etcd_kv.txn([], _puts(257))


def test_oversized_requests_raise_txn_too_large(etcd_kv: EtcdKV) -> None:
    # Above --max-request-bytes (1.5 MiB): etcd's own check.
    with pytest.raises(TxnTooLargeError, match="too large"):
        etcd_kv.txn([], [Put(b"/big", b"x" * (1600 * 1024))])
    # Above the server's gRPC receive limit (1.5 MiB + 512 KiB): gRPC's check.
    with pytest.raises(TxnTooLargeError, match="larger than max"):
        etcd_kv.txn([], [Put(b"/big", b"x" * (3 * 1024 * 1024))])


def test_duplicate_key_in_one_branch(etcd_kv: EtcdKV) -> None:
    with pytest.raises(DuplicateKeyError):
        etcd_kv.txn([], [Put(b"/d", b"1"), Put(b"/d", b"2")])


def test_future_revision(etcd_kv: EtcdKV) -> None:
    rev = etcd_kv.range(b"/x").revision
    with pytest.raises(FutureRevisionError):
        etcd_kv.range(b"/x", revision=rev + 1000)


def test_range_larger_than_grpc_default_limit(etcd_kv: EtcdKV) -> None:
    value = b"v" * (1024 * 1024)
    for i in range(6):  # 6 MiB in all: above gRPC's 4 MiB default receive limit
        etcd_kv.txn([], [Put(b"/large/%d" % i, value)])
    res = etcd_kv.range(b"/large/", prefix_end(b"/large/"))
    assert len(res.kvs) == 6 and all(kv.value == value for kv in res.kvs)
    assert len(range_all(etcd_kv, b"/large/", page=2).kvs) == 6


def test_concurrent_txns_from_several_threads(etcd_kv: EtcdKV) -> None:
    revisions: list[int] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                key = b"/thr/%d/%d" % (t, i)
                res = etcd_kv.txn([Compare.absent(key)], [Put(key, b"x")])
                assert res.succeeded
                revisions.append(res.revision)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(set(revisions)) == 160  # one revision per txn
    assert etcd_kv.range(b"/thr/", prefix_end(b"/thr/")).count == 160


def test_leases(etcd_kv: EtcdKV) -> None:
    lease = etcd_kv.lease_grant(30)
    etcd_kv.txn([], [Put(b"/lease/a", b"1", lease=lease), Put(b"/lease/b", b"2", lease=lease)])
    assert etcd_kv.range(b"/lease/a").kvs[0].lease == lease
    assert 0 < etcd_kv.lease_keepalive(lease) <= 30
    etcd_kv.lease_revoke(lease)
    assert etcd_kv.range(b"/lease/", prefix_end(b"/lease/")).count == 0
    with pytest.raises(LeaseNotFoundError):
        etcd_kv.lease_keepalive(lease)
    with pytest.raises(LeaseNotFoundError):
        etcd_kv.lease_revoke(lease)


def test_status_and_close(etcd_server: EtcdServer) -> None:
    kv = EtcdKV([etcd_server.endpoint])
    assert kv.status().version.startswith("3.5")
    w = kv.watch(b"/closing")
    kv.close()
    assert not w.alive and w.next(timeout=0.1) is None
    kv.close()  # idempotent


# ------------------------------------------------------------------------- watches


def test_watch_delivers_events_not_the_created_response(etcd_kv: EtcdKV) -> None:
    with etcd_kv.watch(b"/w/", prefix_end(b"/w/")) as w:
        assert w.next(timeout=0.2) is None  # "created" is consumed
        r1 = etcd_kv.txn([], [Put(b"/w/a", b"1"), Put(b"/w/b", b"2")]).revision
        r2 = etcd_kv.txn([], [Delete(b"/w/a")]).revision
        first = _next_events(w)
        assert first.revision == r1
        assert [(e.type, e.kv.key, e.kv.value) for e in first.events] == [
            (EventType.PUT, b"/w/a", b"1"),
            (EventType.PUT, b"/w/b", b"2"),
        ]
        second = _next_events(w)
        assert second.revision == r2
        assert second.events[0].type is EventType.DELETE
        assert second.events[0].kv == KeyValue(b"/w/a", b"", 0, r2, 0, 0)
        assert w.resume_revision == r2 + 1
    assert not w.alive and w.next(timeout=0.1) is None


def test_cancel_wakes_a_blocked_next(etcd_kv: EtcdKV) -> None:
    w = etcd_kv.watch(b"/idle", progress_notify=False)
    got: list[WatchResponse | None] = [WatchResponse(-1)]
    reader = threading.Thread(target=lambda: got.__setitem__(0, w.next()))
    reader.start()
    time.sleep(0.1)
    w.cancel()
    reader.join(timeout=5)
    assert not reader.is_alive() and got == [None]
    assert not w.alive


def test_watch_catch_up_is_split_per_revision(etcd_kv: EtcdKV) -> None:
    revs = [etcd_kv.txn([], [Put(b"/h/%d" % i, b"x")]).revision for i in range(5)]
    with etcd_kv.watch(b"/h/", prefix_end(b"/h/"), start_revision=revs[0]) as w:
        got = [_next_events(w) for _ in revs]
    assert [r.revision for r in got] == revs
    assert all(len(r.events) == 1 for r in got)


def test_progress_notifications(etcd_kv: EtcdKV) -> None:
    rev = etcd_kv.txn([], [Put(b"/p/x", b"1")]).revision
    with etcd_kv.watch(b"/p/quiet/", prefix_end(b"/p/quiet/")) as w:
        w.request_progress()
        resp = w.next(timeout=3)
        assert resp is not None and resp.is_progress and resp.revision >= rev
        # Periodic ones too: the server runs with a 1 s progress-notify interval.
        periodic = w.next(timeout=4)
        assert periodic is not None and periodic.is_progress
    with etcd_kv.watch(b"/p/quiet/", progress_notify=False) as w:
        assert w.next(timeout=1.5) is None


@pytest.fixture
def quiet_etcd_kv() -> Iterator[EtcdKV]:
    """An etcd of this test's own whose automatic compaction never runs during it: the
    shared server compacts every minute, and finding the compacted revision reads
    its whole history (slow on a long-lived server)."""
    with make_local_etcd(auto_compaction_retention=3600) as server, \
            EtcdKV([server.endpoint]) as kv:
        yield kv


def test_compaction(quiet_etcd_kv: EtcdKV) -> None:
    etcd_kv = quiet_etcd_kv
    r1 = etcd_kv.txn([], [Put(b"/c/k", b"1")]).revision
    r2 = etcd_kv.txn([], [Put(b"/c/k", b"2")]).revision
    r3 = etcd_kv.txn([], [Put(b"/c/k", b"3")]).revision
    assert etcd_kv.compact_revision() == 0
    etcd_kv.compact(r2)
    assert etcd_kv.compact_revision() == r2
    with pytest.raises(CompactedError) as info:
        etcd_kv.range(b"/c/k", revision=r1)
    assert info.value.compact_revision == r2
    assert etcd_kv.range(b"/c/k", revision=r2).kvs[0].value == b"2"
    with pytest.raises(CompactedError):
        etcd_kv.compact(r1)
    # A watch from below the compacted revision is cancelled, with compact_revision.
    with etcd_kv.watch(b"/c/k", start_revision=r1) as w:
        resp = w.next(timeout=5)
        assert resp == WatchResponse(resp.revision if resp else 0, (), r2, True)
        assert w.next(timeout=0.2) is None  # nothing after the cancel
    # From the compacted revision on, history replays.
    with etcd_kv.watch(b"/c/k", start_revision=r2) as w:
        assert [_next_events(w).revision for _ in range(2)] == [r2, r3]


@pytest.fixture
def watched_etcd(fresh_etcd: LocalEtcd) -> Iterator[tuple[LocalEtcd, EtcdKV]]:
    kv = EtcdKV([fresh_etcd.endpoint])
    try:
        yield fresh_etcd, kv
    finally:
        kv.close()


def test_watch_resumes_after_restart(watched_etcd: tuple[LocalEtcd, EtcdKV]) -> None:
    server, kv = watched_etcd
    r1 = kv.txn([], [Put(b"/r/a", b"1")]).revision
    w = kv.watch(b"/r/", prefix_end(b"/r/"), start_revision=r1)
    assert _next_events(w).revision == r1
    server.restart()
    # Writes while no watch is connected: they must come from the resumed watch.
    missed = [kv.txn([], [Put(b"/r/b", b"%d" % i)]).revision for i in range(3)]
    with pytest.raises(WatchDroppedError):
        while True:
            w.next(timeout=5)
    with pytest.raises(WatchDroppedError):  # and it stays dropped
        w.next(timeout=0)
    assert w.resume_revision == r1 + 1
    with kv.watch(b"/r/", prefix_end(b"/r/"), start_revision=w.resume_revision) as again:
        got = [_next_events(again) for _ in missed]
        assert [r.revision for r in got] == missed
        assert [e.kv.value for r in got for e in r.events] == [b"0", b"1", b"2"]
        assert again.next(timeout=0.3) is None or again.next(timeout=0.3) is None


# ------------------------------------------------------------------ endpoints


def _closed_port_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"  # nothing listens there now


def test_failover_skips_a_dead_endpoint(etcd_server: EtcdServer) -> None:
    dead = _closed_port_endpoint()
    with EtcdKV([dead, etcd_server.endpoint], timeout=5) as kv:
        assert kv.txn([], [Put(b"/fo", b"1")]).succeeded
        assert kv.range(b"/fo").kvs[0].value == b"1"
        with kv.watch(b"/fo") as w:
            assert w.endpoint == etcd_server.endpoint


def test_no_endpoint_answers(etcd_server: EtcdServer) -> None:
    dead = [_closed_port_endpoint(), _closed_port_endpoint()]
    with EtcdKV(dead, timeout=1.0) as kv, pytest.raises(UnavailableError) as info:
        kv.range(b"/x")
    assert dead[0] in str(info.value) and dead[1] in str(info.value)


# ------------------------------------------------------------------------- auth


def _enable_auth(endpoint: str, password: str) -> None:
    """root (required by etcd to enable auth) plus user "app" with read-write on /app/."""
    with grpc.insecure_channel(endpoint) as channel:
        auth = pb_grpc.AuthStub(channel)  # type: ignore[no-untyped-call]
        auth.UserAdd(pb.AuthUserAddRequest(name="root", password=password), timeout=5)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        auth.RoleAdd(pb.AuthRoleAddRequest(name="app"), timeout=5)
        perm = auth_pb2.Permission(
            permType=auth_pb2.Permission.READWRITE, key=b"/app/", range_end=prefix_end(b"/app/")
        )
        auth.RoleGrantPermission(
            pb.AuthRoleGrantPermissionRequest(name="app", perm=perm), timeout=5
        )
        auth.UserAdd(pb.AuthUserAddRequest(name="app", password=password), timeout=5)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="app", role="app"), timeout=5)
        auth.AuthEnable(pb.AuthEnableRequest(), timeout=5)


def test_password_auth(fresh_etcd: LocalEtcd) -> None:
    _enable_auth(fresh_etcd.endpoint, "s3cret")
    with EtcdKV([fresh_etcd.endpoint], username="app", password="s3cret") as kv:
        rev = kv.txn([Compare.absent(b"/app/k")], [Put(b"/app/k", b"1")]).revision
        assert kv.range(b"/app/", prefix_end(b"/app/")).kvs[0].mod_revision == rev
        with kv.watch(b"/app/", prefix_end(b"/app/"), start_revision=rev) as w:
            assert _next_events(w).revision == rev
        with pytest.raises(EtcdAuthError, match="permission denied"):
            kv.range(b"/elsewhere")
        # A token etcd no longer knows (as after expiry): log in again, transparently.
        # (A simple token is "<random>.<raft index>"; etcd waits for that index, so the
        # stand-in for an expired one names an index already passed.)
        kv._metadata = (("token", "expired.1"),)
        assert kv.range(b"/app/k").kvs[0].value == b"1"
        kv._metadata = (("token", "expired.2"),)
        with kv.watch(b"/app/") as w:
            assert w.alive
    with EtcdKV([fresh_etcd.endpoint]) as anonymous, pytest.raises(EtcdAuthError) as info:
        anonymous.range(b"/app/k")
    assert "requires authentication" in str(info.value)
    wrong = EtcdKV([fresh_etcd.endpoint], username="app", password="wrong")
    with wrong, pytest.raises(EtcdAuthError, match="rejected the credentials"):
        wrong.range(b"/app/k")


# ------------------------------------------------------------------ server flags


def test_raised_max_txn_ops_is_applied() -> None:
    with (
        make_local_etcd(max_txn_ops=200) as server,
        EtcdKV([server.endpoint], max_txn_ops=200) as kv,
    ):
        assert kv.txn([], _puts(129)).succeeded
        assert kv.txn([], _puts(200, b"/m/")).succeeded
        with pytest.raises(TxnTooLargeError):
            kv.txn([], _puts(201, b"/o/"))


def test_a_client_learns_the_servers_max_txn_ops() -> None:
    """Without a limit given, EtcdKV asks the server (the largest of its candidates the
    server accepts), so a store sized by it never sends a transaction etcd refuses."""
    with make_local_etcd(max_txn_ops=200) as server, EtcdKV([server.endpoint]) as kv:
        assert kv.max_txn_ops == 128
        assert kv.txn([], _puts(kv.max_txn_ops)).succeeded
    with make_local_etcd() as server, EtcdKV([server.endpoint]) as kv:
        assert kv.max_txn_ops == 256  # what omega's launcher sets
