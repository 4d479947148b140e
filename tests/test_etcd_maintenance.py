"""The etcd maintenance loop (cellstate/maintenance.py) against real etcd servers: the
NOSPACE alarm detected, reported and recovered from (the cell takes writes again),
defragmentation one member at a time on a 3-member cluster, the lock that lets one
server do it, and periodic auto-compaction as the launcher configures it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from cellstate.api.client import ServiceUnavailable
from cellstate.api.config import ServerConfig
from cellstate.api.server import CellStateServer
from cellstate.kv.base import Delete, Put, UnavailableError
from cellstate.kv.etcd import EtcdAlarm, EtcdKV, EtcdNoSpaceError, MemberStatus
from cellstate.maintenance import LOCK_KEY, Maintainer, MaintenancePolicy, MaintenanceReport
from omega.etcd_launcher import LocalEtcd, local_cluster
from omega.statusfmt import etcd_line
from tests.api.service_fixture import client_for
from tests.etcd_fixture import etcd_args_for_tests, make_local_etcd

pytestmark = pytest.mark.etcd

MiB = 1024 * 1024
SMALL_QUOTA = 16 * MiB
# A small etcd has few revisions: keep only 5 of them when compacting under NOSPACE.
NOSPACE_POLICY = MaintenancePolicy(quota_bytes=SMALL_QUOTA, keep_revisions=5)
# Rewriting a few keys makes history only: compaction can free all of it.
BLOB = b"x" * 100_000


def fill_until_nospace(kv: EtcdKV, prefix: bytes = b"/junk/") -> None:
    """Rewrite ten keys until etcd raises NOSPACE (a few hundred writes)."""
    for n in range(10_000):
        try:
            kv.txn([], [Put(prefix + b"%d" % (n % 10), BLOB)])
        except EtcdNoSpaceError:
            return
    raise AssertionError("etcd never ran out of space")


def write_history(kv: EtcdKV, n: int = 60) -> None:
    """Rewrite keys ``n`` times and compact it all away: free pages to defragment on
    every member. Waited for: each member compacts on its own time, and its backend
    counts the pages freed only once a later write transaction commits."""
    rev = 0
    for i in range(n):
        rev = kv.txn([], [Put(b"/junk/%d" % (i % 5), BLOB)]).revision
    kv.compact(rev, physical=True)
    deadline = time.monotonic() + 20
    while any(kv.member_status(e).free_bytes < 2 * MiB for e in kv.endpoints):
        assert time.monotonic() < deadline, "compaction freed no space on some member"
        kv.txn([], [Put(b"/tick", b"1")])
        time.sleep(0.1)


@pytest.fixture
def small_etcd() -> Iterator[LocalEtcd]:
    server = make_local_etcd(quota_backend_bytes=SMALL_QUOTA)
    try:
        server.start()
        yield server
    finally:
        server.stop()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(0.01)  # the member is real: give it a moment


class RecordingKV(EtcdKV):
    """A real EtcdKV that records every defragmentation (start, end) and every status
    read, and can make one member's defragmentation fail."""

    def __init__(self, endpoints: list[str], fail_defrag: str | None = None) -> None:
        super().__init__(endpoints)
        self.events: list[tuple[str, str]] = []
        self.fail_defrag = fail_defrag
        self._busy = threading.Lock()

    def defragment(self, endpoint: str, timeout: float = 600.0) -> None:
        # Two defragmentations overlapping would block here and fail the test.
        assert self._busy.acquire(blocking=False), "two defragmentations at once"
        try:
            self.events.append(("defrag-start", endpoint))
            if endpoint == self.fail_defrag:
                raise UnavailableError(f"{endpoint} injected failure")
            super().defragment(endpoint, timeout)
            self.events.append(("defrag-end", endpoint))
        finally:
            self._busy.release()

    def member_status(self, endpoint: str, timeout: float | None = None) -> MemberStatus:
        self.events.append(("status", endpoint))
        return super().member_status(endpoint, timeout)


# -- NOSPACE ---------------------------------------------------------------------------


def test_nospace_is_detected_reported_and_recovered(small_etcd: LocalEtcd) -> None:
    with EtcdKV([small_etcd.endpoint]) as kv:
        fill_until_nospace(kv)
        with pytest.raises(EtcdNoSpaceError, match="NOSPACE"):
            kv.txn([], [Put(b"/after", b"1")])
        assert [a.kind for a in kv.alarms()] == ["NOSPACE"]

        report = Maintainer(kv, "t", NOSPACE_POLICY).run_once()

        assert [a.kind for a in report.alarms] == ["NOSPACE"]
        assert any("NOSPACE alarm" in e and "read-only" in e for e in report.errors)
        assert report.pressure and report.holder
        assert any(a.startswith("compacted history") for a in report.actions)
        assert any(a.startswith("defragmented") for a in report.actions)
        assert any(a.startswith("disarmed NOSPACE") for a in report.actions)
        assert not report.read_only
        assert kv.alarms() == ()
        assert kv.txn([], [Put(b"/after", b"1")]).succeeded  # writes again
        assert kv.member_status(small_etcd.endpoint).db_size < SMALL_QUOTA // 2


def test_nospace_left_raised_when_live_data_fills_the_quota(small_etcd: LocalEtcd) -> None:
    with EtcdKV([small_etcd.endpoint]) as kv:
        n = 0
        with pytest.raises(EtcdNoSpaceError):
            while True:  # distinct keys: live data, nothing to compact away
                kv.txn([], [Put(b"/live/%d" % n, BLOB)])
                n += 1
        report = Maintainer(kv, "t", NOSPACE_POLICY).run_once()
        assert report.read_only
        assert any("NOSPACE alarm left raised" in e and "live data" in e
                   for e in report.errors)
        assert [a.kind for a in kv.alarms()] == ["NOSPACE"]


def test_server_reports_nospace_and_takes_commits_again(small_etcd: LocalEtcd) -> None:
    kv = EtcdKV([small_etcd.endpoint])
    # A long interval: the server's loop runs its first pass at start only, and the
    # test runs the next one itself, so that what happens in between is certain.
    policy = MaintenancePolicy(interval=3600, quota_bytes=SMALL_QUOTA, keep_revisions=5)
    server = CellStateServer(kv, ServerConfig(listen="127.0.0.1:0", name="s0"),
                             maintenance=policy)
    server.start()
    job = {"id": "j1", "scheduler": "batch", "task_count": 1, "task_resources": {"cpu": 1}}
    try:
        with client_for(server, retry_for=0.5) as client:
            assert server.maintainer is not None
            deadline = time.monotonic() + 30
            while server.maintainer.last_report is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.status()["etcd"]["alarms"] == []
            fill_until_nospace(kv)
            with pytest.raises(ServiceUnavailable, match="NOSPACE"):
                client.submit_job(job)  # the cell is read-only, and says why

            server.maintainer.run_once()

            etcd = client.status()["etcd"]
            assert [a.split()[0] for a in etcd["alarms"]] == ["NOSPACE"]
            assert any("NOSPACE alarm" in e for e in etcd["errors"])
            assert any(a.startswith("disarmed NOSPACE") for a in etcd["actions"])
            assert not etcd["read_only"]
            revision = client.submit_job(job)  # writes again
            assert kv.range(server.replica.keys.job("j1")).kvs[0].mod_revision == revision
    finally:
        server.stop(grace=0)
        kv.close()


def test_space_pressure_compacts_and_defragments_before_nospace(fresh_etcd: LocalEtcd) -> None:
    # The quota as the policy sees it is 64 MiB (the etcd runs with the default), and
    # pressure begins at a quarter of it; the backend file grows in steps (bbolt).
    clock = FakeClock()
    quota = 64 * MiB
    policy = MaintenancePolicy(quota_bytes=quota, pressure_fraction=0.25, keep_revisions=5)
    endpoint = fresh_etcd.endpoint
    with EtcdKV([endpoint]) as kv:
        i = 0
        while kv.member_status(endpoint).db_size < quota // 4:  # history only
            kv.txn([], [Put(b"/junk/%d" % (i % 5), BLOB)])
            i += 1
        m = Maintainer(kv, "t", policy, clock=clock, sleep=clock.sleep)
        first = m.run_once()
        assert first.pressure and not first.alarms
        assert any(a.startswith("compacted history") for a in first.actions)
        deadline = time.monotonic() + 20  # until the backend counts the freed pages
        while kv.member_status(endpoint).free_bytes < quota // 8:
            assert time.monotonic() < deadline
            kv.txn([], [Put(b"/tick", b"1")])
            time.sleep(0.1)
        second = m.run_once()
        assert not any(a.startswith("compacted") for a in second.actions)  # paced
        assert any(a.startswith("defragmented") for a in second.actions)
        assert kv.member_status(endpoint).db_size < quota // 8


# -- defragmentation, one member at a time -----------------------------------------------


@pytest.fixture
def cluster() -> Iterator[list[LocalEtcd]]:
    members = local_cluster(3, **etcd_args_for_tests())
    try:
        yield members
    finally:
        for m in members:
            m.stop()


def test_defragments_members_one_at_a_time_followers_first(cluster: list[LocalEtcd]) -> None:
    endpoints = [m.endpoint for m in cluster]
    with RecordingKV(endpoints) as kv:
        write_history(kv)
        before = {e: kv.member_status(e) for e in endpoints}
        leader = next(e for e, s in before.items() if s.is_leader)
        kv.events.clear()
        policy = MaintenancePolicy(defrag_free_fraction=0.1, defrag_min_free_bytes=MiB)

        report = Maintainer(kv, "t", policy).run_once()

        defrags = [(kind, e) for kind, e in kv.events if kind.startswith("defrag")]
        order = [e for kind, e in defrags if kind == "defrag-start"]
        assert sorted(order) == sorted(endpoints) and order[-1] == leader
        # Each one ends, and its member answers again, before the next one starts.
        for i, e in enumerate(order[:-1]):
            end = kv.events.index(("defrag-end", e))
            nxt = kv.events.index(("defrag-start", order[i + 1]))
            assert end < kv.events.index(("status", e), end) < nxt
        assert len([a for a in report.actions if a.startswith("defragmented")]) == 3
        for e in endpoints:
            assert kv.member_status(e).db_size < before[e].db_size


def test_a_failed_defragmentation_blocks_no_second_member(cluster: list[LocalEtcd]) -> None:
    endpoints = [m.endpoint for m in cluster]
    with EtcdKV(endpoints) as plain:
        write_history(plain)
        leader = next(e for e in endpoints if plain.member_status(e).is_leader)
    first_follower = next(e for e in endpoints if e != leader)
    with RecordingKV(endpoints, fail_defrag=first_follower) as kv:
        policy = MaintenancePolicy(defrag_free_fraction=0.1, defrag_min_free_bytes=MiB)
        report = Maintainer(kv, "t", policy).run_once()
        starts = [e for kind, e in kv.events if kind == "defrag-start"]
        assert starts == [first_follower]
        assert any(f"defragmenting {first_follower} failed" in e for e in report.errors)


def test_defragmentation_waits_min_interval_unless_space_is_short(fresh_etcd: LocalEtcd,
                                                                  ) -> None:
    clock = FakeClock()
    with RecordingKV([fresh_etcd.endpoint]) as kv:
        policy = MaintenancePolicy(defrag_free_fraction=0.1, defrag_min_free_bytes=MiB,
                                   defrag_min_interval=600)
        m = Maintainer(kv, "t", policy, clock=clock, sleep=clock.sleep)
        write_history(kv)
        assert any(a.startswith("defragmented") for a in m.run_once().actions)
        write_history(kv)
        clock.now += 599
        assert not any(a.startswith("defragmented") for a in m.run_once().actions)
        clock.now += 2
        assert any(a.startswith("defragmented") for a in m.run_once().actions)


# -- one server at a time ------------------------------------------------------------------


def test_only_the_lock_holder_maintains(fresh_etcd: LocalEtcd) -> None:
    policy = MaintenancePolicy(defrag_free_fraction=0.1, defrag_min_free_bytes=MiB)
    with RecordingKV([fresh_etcd.endpoint]) as kv_a, \
            RecordingKV([fresh_etcd.endpoint]) as kv_b:
        a, b = Maintainer(kv_a, "a", policy), Maintainer(kv_b, "b", policy)
        assert not a.run_once().holder  # nothing to do: no lock taken, nothing written
        assert not kv_a.range(LOCK_KEY).kvs
        write_history(kv_a)
        assert a.run_once().holder
        write_history(kv_a)
        report_b = b.run_once()
        assert not report_b.holder and report_b.members  # it still reports sizes
        assert not any(kind.startswith("defrag") for kind, _ in kv_b.events)
        assert kv_a.range(LOCK_KEY).kvs[0].value == b"a"
        a.release()
        assert b.run_once().holder  # takes over at once
        assert any(kind == "defrag-start" for kind, _ in kv_b.events)


def test_a_holder_whose_key_was_deleted_takes_the_lock_again(fresh_etcd: LocalEtcd) -> None:
    policy = MaintenancePolicy(defrag_free_fraction=0.1, defrag_min_free_bytes=MiB,
                               defrag_min_interval=0)
    with EtcdKV([fresh_etcd.endpoint]) as kv:
        m = Maintainer(kv, "a", policy)
        write_history(kv)
        assert m.run_once().holder
        kv.txn([], [Delete(LOCK_KEY)])  # e.g. someone cleaned up the keyspace
        write_history(kv)
        assert m.run_once().holder
        assert kv.range(LOCK_KEY).kvs[0].value == b"a"  # held again, not just believed


def test_under_nospace_a_server_without_the_lock_recovers_if_nobody_holds_it(
    small_etcd: LocalEtcd,
) -> None:
    with EtcdKV([small_etcd.endpoint]) as kv:
        fill_until_nospace(kv)  # no lease can be granted now, and nobody holds the lock
        report = Maintainer(kv, "late", NOSPACE_POLICY).run_once()
        assert report.holder and not report.read_only
        assert any("nobody holds the lock" in a for a in report.actions)


# -- auto-compaction as launched --------------------------------------------------------------


def test_periodic_auto_compaction_compacts_within_seconds() -> None:
    # A 1-second retention: etcd's periodic compactor must read "1s" as a duration (a
    # bare "1" would be an hour) and compact without any client asking.
    server = make_local_etcd(auto_compaction_retention=1)
    try:
        server.start()
        with EtcdKV([server.endpoint]) as kv:
            rev = kv.txn([], [Put(b"/k", b"1")]).revision
            deadline = time.monotonic() + 20
            while kv.compact_revision() < rev and time.monotonic() < deadline:
                kv.txn([], [Put(b"/k", b"2")])
                time.sleep(0.2)
            assert kv.compact_revision() >= rev
    finally:
        server.stop()


def test_status_text_says_when_the_cell_is_read_only() -> None:
    member = MemberStatus("e0:2379", 0xAB, 0xAB, 2048 * MiB, 1500 * MiB, 9, 2, "3.5.17")
    stuck = MaintenanceReport(1.0, (member,), alarms=(EtcdAlarm(0xAB, "NOSPACE"),),
                              read_only=True).to_doc()
    assert etcd_line(stuck) == ("etcd: THE CELL IS READ-ONLY (etcd refuses writes); ALARMS "
                                "NOSPACE on member ab; e0:2379 2048 MiB (1500 in use)")
    fine = MaintenanceReport(1.0, (member,)).to_doc()
    assert etcd_line(fine) == "etcd: e0:2379 2048 MiB (1500 in use)"
