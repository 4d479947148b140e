"""Keeps etcd's backend bounded: defragmentation, the space quota, the NOSPACE alarm.

etcd's auto-compaction (a server flag, see ``omega.etcd_launcher.server_flags``) drops
old revisions, but the backend file keeps the freed pages and the space quota counts
the file. When a write would take the file past ``--quota-backend-bytes``, etcd raises
the NOSPACE alarm and refuses every write (puts, deletes, leases) until the space is
freed *and* someone disarms the alarm: the cell goes read-only. A :class:`Maintainer`
prevents and repairs that. Every pass (:meth:`Maintainer.run_once`):

1. reads each member's status (file size, size in use, leader) and the cluster's alarms;
   a NOSPACE alarm is logged as an error on every pass while it lasts;
2. under *pressure* (NOSPACE raised, or a member's file at ``pressure_fraction`` of the
   quota) compacts history down to the newest ``keep_revisions`` revisions, waiting
   until the compacted entries are gone from the backend (at most every
   ``pressure_interval`` unless NOSPACE);
3. defragments the members with much free space (``defrag_free_fraction`` of the file
   and at least ``defrag_min_free_bytes``, not the same member within
   ``defrag_min_interval``; under pressure ``pressure_min_free_fraction`` free, at most
   every ``pressure_interval``; under NOSPACE every member), one member at a time,
   followers before the leader, each only after the previous one answers again. A
   defragmentation blocks its member for its duration (it copies the data in use into a
   new file: 0.3-0.4 s for a 200 MiB file holding 15 MiB here), hence the restraint;
4. disarms a NOSPACE alarm once every member's file is below the pressure mark again,
   and says loudly when it cannot (the live data fills the quota).

Only one server does steps 2-4 at a time: the holder of a leased key (:data:`LOCK_KEY`),
taken by the first server that finds work to do and kept alive from then on (a pass
with nothing to do writes nothing). Two servers defragmenting at once would be harmless for
correctness (etcd serializes a member's defragmentations, and every write of the store
is guarded by revisions, never by this key), but two *members* blocked at once cost a
3-member cluster its quorum for that time. An etcd lock is good enough for that
(etcd-facts: its locks are unsafe for correctness, which this does not rely on). Under
NOSPACE no lease can be granted: a server that holds none then acts when nobody holds
the key, since recovering the cell matters more than exclusivity.

The clock is injected (:class:`Maintainer` ``clock``), so the pacing is testable
without waiting. The server runs one :class:`Maintainer` per replica in a thread
(:meth:`Maintainer.start`); :attr:`Maintainer.last_report` is what it saw last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from cellstate.kv.base import CompactedError, Compare, Get, KVError, LeaseNotFoundError, Put
from cellstate.kv.etcd import EtcdAlarm, EtcdAuthError, EtcdKV, EtcdNoSpaceError, MemberStatus

__all__ = [
    "DEFAULT_QUOTA_BACKEND_BYTES",
    "LOCK_KEY",
    "Maintainer",
    "MaintenancePolicy",
    "MaintenanceReport",
]

log = logging.getLogger(__name__)

MiB: Final = 1024 * 1024
GiB: Final = 1024 * MiB
# The one space quota: the launcher's --quota-backend-bytes, docker-compose.yml and
# docs/operations.md state this value (tests/test_etcd_quota.py checks all three).
# etcd's own default; 8 GiB is the most etcd advises. With auto-compaction and this
# loop the backend stays far below it (docs/performance.md, "etcd size over time").
DEFAULT_QUOTA_BACKEND_BYTES: Final = 2 * GiB
# Outside every cell's prefix (/omega/<cell>/): replicas never see it.
LOCK_KEY: Final = b"/omega-maintenance/lock"
NOSPACE: Final = "NOSPACE"


@attrs.frozen
class MaintenancePolicy:
    """When to compact, defragment and disarm. ``quota_bytes`` must be the members'
    ``--quota-backend-bytes`` (etcd 3.5 does not report it)."""

    interval: float = 10.0  # seconds between passes
    quota_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES
    pressure_fraction: float = 0.75  # of the quota: compact hard and defragment now
    defrag_free_fraction: float = 0.5  # of the file free: worth a defragmentation ...
    defrag_min_free_bytes: int = 128 * MiB  # ... and at least this much
    defrag_min_interval: float = 600.0  # seconds between defragmentations of a member
    # Under pressure (not NOSPACE): compact and defragment at most this often, and a
    # member only when this share of its file is free; so a quota set larger than
    # quota_bytes, or live data near the mark, does not block members every pass.
    pressure_interval: float = 60.0
    pressure_min_free_fraction: float = 0.1
    keep_revisions: int = 1000  # history a pressure compaction keeps
    lock_ttl: int = 60  # seconds; a dead holder's key lapses after this
    member_timeout: float = 5.0  # for a status call
    defrag_timeout: float = 600.0
    recover_timeout: float = 30.0  # for a defragmented member to answer again

    def __attrs_post_init__(self) -> None:
        checks = (
            ("interval", self.interval > 0, "must be positive"),
            ("quota_bytes", self.quota_bytes > 0, "must be positive"),
            ("pressure_fraction", 0 < self.pressure_fraction < 1, "must be in (0, 1)"),
            ("defrag_free_fraction", 0 < self.defrag_free_fraction < 1, "must be in (0, 1)"),
            ("defrag_min_free_bytes", self.defrag_min_free_bytes >= 0, "must be >= 0"),
            ("defrag_min_interval", self.defrag_min_interval >= 0, "must be >= 0"),
            ("pressure_interval", self.pressure_interval >= 0, "must be >= 0"),
            ("pressure_min_free_fraction", 0 <= self.pressure_min_free_fraction < 1,
             "must be in [0, 1)"),
            ("keep_revisions", self.keep_revisions >= 0, "must be >= 0"),
            ("lock_ttl", self.lock_ttl >= 5, "must be at least 5 seconds"),
        )
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"MaintenancePolicy.{name} {why}, got {getattr(self, name)!r}")


@attrs.frozen
class MaintenanceReport:
    """What one pass saw and did. ``members`` holds a status per endpoint that answered;
    ``unreachable`` the endpoints that did not; ``alarms`` those raised when the pass
    began; ``read_only`` whether etcd still refuses writes at its end."""

    at: float
    members: tuple[MemberStatus, ...] = ()
    unreachable: tuple[str, ...] = ()
    alarms: tuple[EtcdAlarm, ...] = ()
    holder: bool = False
    pressure: bool = False
    actions: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    read_only: bool = False

    @property
    def db_size(self) -> int:
        """The largest member file: what the quota is reached by first."""
        return max((m.db_size for m in self.members), default=0)

    def to_doc(self) -> dict[str, Any]:
        """A JSON-able summary (for status output and logs)."""
        return {
            "at": self.at,
            "members": [
                {"endpoint": m.endpoint, "member": f"{m.member_id:x}", "leader": m.is_leader,
                 "db_size": m.db_size, "db_size_in_use": m.db_size_in_use,
                 "revision": m.revision}
                for m in self.members
            ],
            "unreachable": list(self.unreachable),
            "alarms": [str(a) for a in self.alarms],
            "holder": self.holder,
            "pressure": self.pressure,
            "actions": list(self.actions),
            "errors": list(self.errors),
            "read_only": self.read_only,
        }


class _Pass:
    """The mutable notes of one pass, frozen into a MaintenanceReport at its end."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.members: list[MemberStatus] = []
        self.unreachable: list[str] = []
        self.alarms: tuple[EtcdAlarm, ...] = ()
        self.holder = False
        self.pressure = False
        self.actions: list[str] = []
        self.errors: list[str] = []
        self.read_only = False

    def act(self, what: str) -> None:
        log.info("etcd maintenance: %s", what)
        self.actions.append(what)

    def error(self, what: str) -> None:
        log.error("etcd maintenance: %s", what)
        self.errors.append(what)

    def report(self) -> MaintenanceReport:
        return MaintenanceReport(
            self.at, tuple(self.members), tuple(self.unreachable), self.alarms, self.holder,
            self.pressure, tuple(self.actions), tuple(self.errors), self.read_only,
        )


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


class Maintainer:
    """The maintenance loop of one server over ``kv``'s endpoints (every member of the
    cluster must be among them: each is defragmented through its own endpoint).

    ``name`` identifies this server in the lock key. ``clock`` (monotonic seconds) paces
    defragmentations; ``sleep`` waits for a defragmented member to come back."""

    def __init__(
        self,
        kv: EtcdKV,
        name: str,
        policy: MaintenancePolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        lock_key: bytes = LOCK_KEY,
    ) -> None:
        self.kv = kv
        self.name = name
        self.policy = policy or MaintenancePolicy()
        self.clock = clock
        self.sleep = sleep
        self.lock_key = lock_key
        self._lease = 0  # our lock's lease, 0 when we hold none
        self._last_defrag: dict[int, float] = {}  # member id -> clock at its defrag
        self._last_compact: float | None = None  # clock at the last pressure compaction
        self._report: MaintenanceReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def last_report(self) -> MaintenanceReport | None:
        return self._report

    # -- one pass ---------------------------------------------------------------------

    def run_once(self) -> MaintenanceReport:
        """One pass (see the module docstring); never raises for an etcd error: the
        report lists it."""
        p = _Pass(self.clock())
        try:
            self._pass(p)
        except KVError as e:
            p.error(f"pass failed: {e}")
        report = p.report()
        self._report = report
        return report

    def _pass(self, p: _Pass) -> None:
        self._read_members(p)
        p.alarms = self.kv.alarms()
        nospace = [a for a in p.alarms if a.kind == NOSPACE]
        for a in p.alarms:
            if a.kind == NOSPACE:
                p.error(
                    f"NOSPACE alarm ({a}): etcd refuses every write, the cell is read-only; "
                    f"largest member file {_mib(self._largest(p))} of a "
                    f"{_mib(self.policy.quota_bytes)} quota"
                )
            else:
                p.error(f"etcd alarm {a}: not handled here, see etcd's log")
        p.read_only = bool(nospace)
        p.pressure = bool(nospace) or self._largest(p) >= self._pressure_mark()
        compact = p.pressure and (bool(nospace) or self._due(self._last_compact,
                                                             self.policy.pressure_interval))
        work = compact or bool(nospace) or any(
            self._wants_defrag(m, p.pressure, bool(nospace)) for m in p.members)
        if not work and not self._lease:
            return  # nothing to do: no lock taken, nothing written to etcd
        p.holder = self._hold_lock(p, bool(nospace))
        if not p.holder or not work:
            return
        if compact:
            self._compact(p)
            self._last_compact = self.clock()
            self._read_members(p)
        self._defragment(p, bool(nospace))
        if nospace:
            self._disarm(p, nospace)

    def _pressure_mark(self) -> float:
        return self.policy.pressure_fraction * self.policy.quota_bytes

    @staticmethod
    def _largest(p: _Pass) -> int:
        return max((m.db_size for m in p.members), default=0)

    def _read_members(self, p: _Pass) -> None:
        p.members, p.unreachable = [], []
        for endpoint in self.kv.endpoints:
            try:
                p.members.append(self.kv.member_status(endpoint, self.policy.member_timeout))
            except KVError as e:
                p.unreachable.append(endpoint)
                log.warning("etcd maintenance: member %s: %s", endpoint, e)

    # -- the lock ---------------------------------------------------------------------

    def _hold_lock(self, p: _Pass, nospace: bool) -> bool:
        """Whether this server does the work this pass: it holds the leased key, or
        takes it now, or (under NOSPACE, when no lease can be had) nobody holds it."""
        if self._lease:
            try:
                self.kv.lease_keepalive(self._lease)
                held = self.kv.range(self.lock_key).kvs
                if held and held[0].lease == self._lease:
                    return True
                self.kv.lease_revoke(self._lease)  # the key went (deleted by hand)
            except LeaseNotFoundError:
                pass
            self._lease = 0
            log.info("etcd maintenance: lost the maintenance lock; trying again")
        try:
            lease = self.kv.lease_grant(self.policy.lock_ttl)
        except EtcdNoSpaceError:
            held = self.kv.range(self.lock_key).kvs
            if held:
                p.act(f"NOSPACE: leaving recovery to the lock holder {held[0].value.decode()!r}")
                return False
            p.act("NOSPACE: no lease can be granted and nobody holds the lock; recovering")
            return True
        res = self.kv.txn([Compare.absent(self.lock_key)],
                          [Put(self.lock_key, self.name.encode(), lease)],
                          [Get(self.lock_key)])
        if res.succeeded:
            self._lease = lease
            p.act(f"took the maintenance lock ({self.name})")
            return True
        self.kv.lease_revoke(lease)
        if nospace:
            # Another server holds the key and will recover; nothing for us to do.
            log.info("etcd maintenance: the lock holder recovers from NOSPACE")
        return False

    def release(self) -> None:
        """Give the lock up (at shutdown), so another server takes over at once."""
        lease, self._lease = self._lease, 0
        if lease:
            try:
                self.kv.lease_revoke(lease)
            except KVError as e:
                log.info("etcd maintenance: releasing the lock: %s", e)

    # -- the work ---------------------------------------------------------------------

    def _compact(self, p: _Pass) -> None:
        revision = max((m.revision for m in p.members), default=0)
        target = revision - self.policy.keep_revisions
        if target <= 1:
            return
        try:
            self.kv.compact(target, physical=True)
            p.act(f"compacted history to revision {target} (space pressure: largest file "
                  f"{_mib(self._largest(p))}, quota {_mib(self.policy.quota_bytes)})")
        except CompactedError:
            pass  # already compacted at least that far: nothing older to drop

    def _due(self, last: float | None, interval: float) -> bool:
        return last is None or self.clock() - last >= interval

    def _wants_defrag(self, m: MemberStatus, pressure: bool, nospace: bool) -> bool:
        free = m.free_bytes
        last = self._last_defrag.get(m.member_id)
        if nospace:
            # Always: the freed pages of the compaction just done show in the size in
            # use only after the backend's next commit, and nothing else can help.
            return True
        if pressure:
            return (free >= self.policy.pressure_min_free_fraction * m.db_size
                    and self._due(last, self.policy.pressure_interval))
        return (free >= self.policy.defrag_free_fraction * m.db_size
                and free >= self.policy.defrag_min_free_bytes
                and self._due(last, self.policy.defrag_min_interval))

    def _defragment(self, p: _Pass, nospace: bool) -> None:
        # Followers first: a leader's defragmentation stalls every write of the
        # cluster, a follower's only that follower.
        todo = sorted((m for m in p.members if self._wants_defrag(m, p.pressure, nospace)),
                      key=lambda m: m.is_leader)
        for m in todo:
            started = self.clock()
            try:
                self.kv.defragment(m.endpoint, self.policy.defrag_timeout)
            except EtcdAuthError as e:
                # A server whose etcd user has only its cell's role (cellstate.etcd_auth):
                # retried at the defragmentation pace, not every pass.
                self._last_defrag[m.member_id] = self.clock()
                p.error(f"defragmenting {m.endpoint} needs etcd's root role, which this "
                        f"server's etcd user lacks ({e}); defragment it as root "
                        "(etcdctl defrag) or grant the role (docs/security.md)")
                return
            except KVError as e:
                p.error(f"defragmenting {m.endpoint} failed: {e}")
                return  # it may still be busy: block no second member
            took = self.clock() - started
            self._last_defrag[m.member_id] = self.clock()
            after = self._await_member(m.endpoint)
            if after is None:
                p.error(f"{m.endpoint} did not answer within {self.policy.recover_timeout:g} s "
                        "of its defragmentation; defragmenting no other member this pass")
                return
            p.act(f"defragmented {m.endpoint}: {_mib(m.db_size)} -> {_mib(after.db_size)} "
                  f"({_mib(after.db_size_in_use)} in use) in {took:.1f} s")
            p.members = [after if x.endpoint == m.endpoint else x for x in p.members]

    def _await_member(self, endpoint: str) -> MemberStatus | None:
        """The member's status once it answers again and knows a leader."""
        deadline = self.clock() + self.policy.recover_timeout
        while True:
            try:
                status = self.kv.member_status(endpoint, self.policy.member_timeout)
                if status.leader:
                    return status
            except KVError:
                pass
            if self.clock() >= deadline:
                return None
            self.sleep(0.2)

    def _disarm(self, p: _Pass, alarms: list[EtcdAlarm]) -> None:
        largest = self._largest(p)
        if p.unreachable or largest >= self._pressure_mark():
            why = (f"members {', '.join(p.unreachable)} did not answer" if p.unreachable else
                   f"the largest member file is still {_mib(largest)} after compaction and "
                   f"defragmentation (quota {_mib(self.policy.quota_bytes)}): the live data "
                   "fills it; raise --quota-backend-bytes (and MaintenancePolicy.quota_bytes) "
                   "or delete data")
            p.error(f"NOSPACE alarm left raised: {why}")
            return
        for alarm in alarms:
            self.kv.disarm(alarm)
            p.act(f"disarmed {alarm}: largest member file {_mib(largest)}, etcd takes "
                  "writes again")
        p.read_only = any(a.kind == NOSPACE for a in self.kv.alarms())

    # -- the thread -------------------------------------------------------------------

    def start(self) -> Maintainer:
        """Run passes every ``policy.interval`` seconds in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("Maintainer already started")
        self._thread = threading.Thread(target=self._run, name="etcd-maintenance", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a bug must not end maintenance for the server's lifetime
                log.exception("etcd maintenance pass failed")
            self._stop.wait(self.policy.interval)

    def stop(self) -> None:
        """End the thread (after the pass in progress, waiting 5 s at most) and release
        the lock."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            # Not for a whole pass: a server's shutdown must not wait for an etcd that
            # does not answer (the thread is a daemon and ends after its pass).
            self._thread.join(timeout=5.0)
        self.release()
