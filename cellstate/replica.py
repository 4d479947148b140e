"""Synced local copies of a cell (Omega §3.4: each scheduler's private copy).

A :class:`Replica` loads the cell at a revision, then follows every change from the
next revision with a watch, applying the events of each revision together so that
every snapshot it hands out is the cell as it was at exactly one revision. It resumes
a dropped stream from its last revision + 1, reloads when the history it needs was
compacted away, and reports how far behind it may be.

Snapshots share structure with the replica's maps (immutable HAMTs), so taking one is
O(1) and a scheduler can take one per decision.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

import attrs

from cellstate import codec
from cellstate.cell import TABLES, CellSnapshot
from cellstate.keys import KeyKind, Keyspace, split_alloc
from cellstate.kv.base import (
    KV,
    EventType,
    KeyValue,
    KVError,
    RangeResult,
    WatchDroppedError,
    Watcher,
    WatchResponse,
    range_all,
)
from cellstate.model import CellConfig, Machine, TaskRecord
from cellstate.records import RECORDS, with_revision

log = logging.getLogger(__name__)

# Records a writer said it writes (Replica.expect) kept at most: a few seconds of the
# commit leader's writes; those its failed writes left are dropped, oldest first.
EXPECTED_MAX = 100_000

# key -> (the value written, the record it encodes, and for a machine the values of
# the allocation keys the same write put, by key, and the machine's revision the write
# is guarded at): records a writer holds for keys it writes (Replica.expect).
Expected = tuple[bytes, object, "Mapping[bytes, bytes] | None", int]
Known = dict[bytes, Expected]


def _apply(
    keys: Keyspace, snap: CellSnapshot, changes: Iterable[tuple[bytes, KeyValue | None]],
    revision: int, changed: list[tuple[KeyKind, str]] | None = None,
    known: Known | None = None,
) -> CellSnapshot:
    """``snap`` with the changes of one or more whole revisions applied; the (kind, id)
    of each changed record is appended to ``changed`` if given (a change to one of a
    machine's allocations is a change to the machine). A record in ``known`` with the
    value the change carries (for a machine: see ``_known_machine``) is taken as is,
    at the change's revision, instead of decoding the value, and removed from
    ``known``."""
    mutators = {name: getattr(snap, name).mutate() for name in TABLES}
    config = snap.config
    # A machine's record and its allocation keys change in the same etcd transaction
    # but arrive as separate events (allocations first, in key order): gather both,
    # then build each touched machine once.
    machine_records: dict[str, KeyValue | None] = {}
    alloc_changes: dict[str, dict[str, tuple[int, KeyValue | None]]] = {}
    for key, kv in changes:
        kind = keys.classify(key)
        if kind is None:
            continue
        if kind[0] is KeyKind.ALLOC:
            # A changed allocation's old key is deleted before its new one is put (in
            # one revision, in that order), so the last event per task is its state.
            mid, seq, tid = split_alloc(kind[1])
            alloc_changes.setdefault(mid, {})[tid] = (seq, kv)
            continue
        if changed is not None:
            changed.append(kind)
        if kind[0] is KeyKind.MACHINE:
            machine_records[kind[1]] = kv
            continue
        if kind[0] is KeyKind.CONFIG:
            config = codec.decode_config(kv.value, kv.mod_revision) if kv else CellConfig()
            continue
        rk = RECORDS[kind[0]]
        table = mutators[rk.table]
        if kv is None:
            table.pop(kind[1], None)
        elif (known and (held := known.get(key)) is not None and held[0] == kv.value
              and type(held[1]) is TaskRecord):
            # The value a writer encoded this record to: decoding it gives the record.
            table[kind[1]] = with_revision(held[1], kv.mod_revision)
            del known[key]
        else:
            table[kind[1]] = rk.decode(kind[1], kv.value, kv.mod_revision)
    if machine_records or alloc_changes:
        _apply_machines(mutators["machines"], machine_records, alloc_changes, changed,
                        keys if known else None, known)
    return CellSnapshot(
        revision,
        config,
        *(mutators[n].finish() for n in TABLES),
    )


def _apply_machines(
    machines: Any,
    records: dict[str, KeyValue | None],
    alloc_changes: dict[str, dict[str, tuple[int, KeyValue | None]]],
    changed: list[tuple[KeyKind, str]] | None,
    keys: Keyspace | None = None,
    known: Known | None = None,
) -> None:
    for mid in records.keys() | alloc_changes.keys():
        old: Machine | None = machines.get(mid)
        if mid in records and records[mid] is None:
            machines.pop(mid, None)
            continue
        if keys is not None and known and mid in records:
            key = keys.machine(mid)
            held = _known_machine(old, records[mid], alloc_changes.get(mid, {}),
                                  known.get(key))
            if held is not None:
                machines[mid] = held
                del known[key]
                continue
        allocs = dict(old.allocations) if old is not None else {}
        for tid, (seq, kv) in alloc_changes.get(mid, {}).items():
            if kv is None:
                allocs.pop(tid, None)
            else:
                allocs[tid] = codec.decode_alloc(tid, kv.value, seq)
        rec = records.get(mid)
        if rec is not None:
            machines[mid] = codec.decode_machine(mid, rec.value, rec.mod_revision, allocs,
                                                 copy=False)
        elif old is not None:
            # Allocations change only with their machine's record; this is the tail of
            # a batch split by the watch (or a hand-made edit): keep the sequence.
            machines[mid] = old.with_allocations(allocs)
            if changed is not None:
                changed.append((KeyKind.MACHINE, mid))
        else:
            log.warning("replica: allocations for unknown machine %s ignored", mid)


def _known_machine(old: Machine | None, rec: KeyValue | None,
                   allocs: Mapping[str, tuple[int, KeyValue | None]],
                   held: Expected | None) -> Machine | None:
    """The machine a writer holds for the record ``rec`` (``held``), if decoding would
    give it: the same record value, written over the machine this replica holds (the
    revision the writer's write was guarded at: then its allocations are the ones the
    writer decided over), every allocation these changes put with the value the writer
    put there, none they delete, and as many as the changes leave. (The writer's write
    may have failed and another made the same record value: then the revision it was
    written over, or its allocations, tell them apart.)"""
    if held is None or rec is None or held[0] != rec.value or type(held[1]) is not Machine:
        return None
    if (old.seq if old is not None else 0) != held[3]:
        return None
    m: Machine = held[1]
    puts = held[2] or {}
    after = m.allocations
    before = old.allocations if old is not None else {}
    count = len(before)
    for tid, (seq, kv) in allocs.items():
        if kv is None:
            if tid in after:
                return None
            count -= tid in before
            continue
        a = after.get(tid)
        if a is None or a.key_seq != seq or puts.get(kv.key) != kv.value:
            return None
        count += tid not in before
    if count != len(after):
        return None
    return m.with_seq(rec.mod_revision)


def snapshot_from_kvs(keys: Keyspace, kvs: Iterable[KeyValue], revision: int) -> CellSnapshot:
    return _apply(keys, CellSnapshot.empty(), ((kv.key, kv) for kv in kvs), revision)


ChangeListener = Callable[[CellSnapshot, "list[tuple[KeyKind, str]] | None"], None]
# (changes, revision, reset): the raw records of one or more whole revisions (value None
# for a delete), or with reset=True every record of the cell at ``revision``.
RecordListener = Callable[["list[tuple[bytes, KeyValue | None]]", int, bool], None]


class Feed(Protocol):
    """Where a replica's records come from: a whole cell at one revision, then every
    change from a revision on. Over etcd that is a range read and a watch
    (:class:`KVFeed`); in a scheduler process it is the cellstate service's sync
    stream (``cellstate.api.client.SyncFeed``)."""

    def load(self, prefix: bytes, revision: int = 0) -> RangeResult:
        """Every record under ``prefix`` at ``revision`` (0: the newest)."""

    def watch(self, prefix: bytes, end: bytes, start_revision: int) -> Watcher: ...


@attrs.frozen
class KVFeed:
    kv: KV

    def load(self, prefix: bytes, revision: int = 0) -> RangeResult:
        return range_all(self.kv, prefix, revision=revision)

    def watch(self, prefix: bytes, end: bytes, start_revision: int) -> Watcher:
        return self.kv.watch(prefix, end, start_revision=start_revision)


@attrs.frozen
class Lag:
    applied_revision: int  # the snapshot's revision
    known_revision: int  # the newest revision the backend told us about
    seconds_since_confirmed: float  # since the replica last knew it was current

    @property
    def revisions_behind(self) -> int:
        return max(self.known_revision - self.applied_revision, 0)


class Replica:
    """A synced, read-only local copy of one cell."""

    def __init__(
        self,
        kv: KV | Feed,
        cell: str = "default",
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_delay: float = 0.2,
    ) -> None:
        # A KV is read through a range and a watch; anything else is a feed already.
        self.feed: Feed = KVFeed(cast(KV, kv)) if hasattr(kv, "txn") else kv
        self.keys = Keyspace(cell)
        self._clock = clock
        self._retry_delay = retry_delay
        self._snap = CellSnapshot.empty()
        self._watcher: Watcher | None = None
        self._known = 0
        self._confirmed_at = clock()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._listeners: list[Callable[[CellSnapshot], None]] = []
        self._change_listeners: list[ChangeListener] = []
        self._record_listeners: list[RecordListener] = []
        self.reloads = 0  # full reloads after compaction
        self.resumes = 0  # watches re-opened after a dropped stream
        # Records a writer following this replica wrote, by key (``expect``).
        self._expected: Known = {}  # insertion order: oldest first
        self._known_lock = threading.Lock()
        self.known_taken = 0  # records taken from ``expect`` rather than decoded

    # -- reading ---------------------------------------------------------------------

    def snapshot(self) -> CellSnapshot:
        return self._snap

    @property
    def revision(self) -> int:
        return self._snap.revision

    def lag(self) -> Lag:
        return Lag(self._snap.revision, max(self._known, self._snap.revision),
                   self._clock() - self._confirmed_at)

    def on_change(self, listener: Callable[[CellSnapshot], None]) -> None:
        """Call ``listener(snapshot)`` after each applied batch (from the sync thread)."""
        self._listeners.append(listener)

    def on_changes(self, listener: ChangeListener) -> None:
        """Call ``listener(snapshot, changed)`` after each applied batch, where
        ``changed`` lists the (kind, id) of every record that changed, or is None after
        a (re)load, when anything may have changed."""
        self._change_listeners.append(listener)

    def on_records(self, listener: RecordListener) -> None:
        """Call ``listener(changes, revision, reset)`` with the raw records behind each
        applied batch, before the snapshot listeners (a watch cache that serves other
        processes keeps the stored bytes rather than re-encoding records)."""
        self._record_listeners.append(listener)

    def expect(self, records: Mapping[bytes, Expected]) -> None:
        """A writer following this replica is about to write ``records`` (key -> the
        value, the machine or task record it encodes, and for a machine the allocation
        keys the write puts, key -> value, and the machine's revision the write is
        guarded at; 0 for a task): when the watch brings one of those keys with
        that value, take the record as it is rather than decoding the value (and the
        machine's allocations) again. The commit leader writes thousands of records a
        second, holding every one already; decoding them again was most of the fifth
        of its CPU it spent applying the watch (docs/scaling.md). Told before the
        write is sent, so the watch cannot bring it first; matched by value, so a
        write that failed is harmless (another writer's identical value decodes to the
        same record; for a machine, the revision it was written over and the
        allocations written are compared too). Those never matched are dropped once
        more than ``EXPECTED_MAX`` wait, oldest first."""
        if not records:
            return
        with self._known_lock:
            known = self._expected
            known.update(records)
            if len(known) > EXPECTED_MAX:
                for key in list(itertools.islice(known, len(known) - EXPECTED_MAX // 2)):
                    del known[key]

    def wait_for(self, revision: int, timeout: float | None = None) -> bool:
        """Block until the replica has applied ``revision`` (or timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._snap.revision < revision:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    # -- syncing ---------------------------------------------------------------------

    def load(self) -> int:
        """(Re)load the whole cell at the current revision and watch from the next."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        res = self.feed.load(self.keys.root)
        for record_listener in self._record_listeners:
            record_listener([(kv.key, kv) for kv in res.kvs], res.revision, True)
        self._publish(snapshot_from_kvs(self.keys, res.kvs, res.revision), None)
        self._known = max(self._known, res.revision)
        self._confirmed_at = self._clock()
        self._open_watch()
        return res.revision

    def _open_watch(self) -> None:
        self._watcher = self.feed.watch(
            self.keys.root, self.keys.end, start_revision=self._snap.revision + 1
        )

    def pump(self, timeout: float = 0.0) -> int:
        """Apply what has arrived (waiting up to ``timeout`` for the first response).
        Returns the number of responses handled. For single-threaded use (tests, the
        simulator); a started replica pumps in its own thread."""
        if self._watcher is None:
            self.load()
        handled = 0
        wait = timeout
        while True:
            if self._watcher is None or self._stopping.is_set():
                return handled
            try:
                response = self._watcher.next(timeout=wait)
            except WatchDroppedError:
                self._resume()
                continue
            if response is None:
                return handled
            self._handle(response)
            handled += 1
            wait = 0.0

    def _resume(self) -> None:
        """Re-open a dropped watch from the last applied revision + 1."""
        self.resumes += 1
        while not self._stopping.is_set():
            try:
                self._open_watch()
                return
            except KVError as e:
                log.warning("replica: cannot re-open watch (%s); retrying", e)
                time.sleep(self._retry_delay)

    def _handle(self, response: WatchResponse) -> None:
        self._known = max(self._known, response.revision)
        if response.canceled:
            if response.compact_revision:
                log.info(
                    "replica: history compacted at %d, past our revision %d: reloading",
                    response.compact_revision, self._snap.revision,
                )
                self.reloads += 1
                self.load()
                return
            raise KVError("watch canceled by the server")
        if not response.events:
            # Progress: every event up to response.revision has been delivered.
            for record_listener in self._record_listeners:
                record_listener([], response.revision, False)
            if response.revision >= self._snap.revision:
                self._publish(attrs.evolve(self._snap, revision=response.revision), [])
            self._confirmed_at = self._clock()
            return
        changes = [
            (e.kv.key, e.kv if e.type is EventType.PUT else None) for e in response.events
        ]
        last = max(e.kv.mod_revision for e in response.events)
        for record_listener in self._record_listeners:
            record_listener(changes, last, False)
        changed: list[tuple[KeyKind, str]] = []
        known: Known | None = None
        size = 0
        if self._expected:
            with self._known_lock:
                known, self._expected = self._expected, {}
            size = len(known)
        snap = _apply(self.keys, self._snap, changes, last, changed, known)
        if known is not None:
            self.known_taken += size - len(known)
            with self._known_lock:
                # Put back those not matched yet; a newer one for a key stays.
                known.update(self._expected)
                self._expected = known
        self._publish(snap, changed)
        if last >= self._known:
            self._confirmed_at = self._clock()

    def _publish(
        self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None
    ) -> None:
        with self._cond:
            self._snap = snap
            self._cond.notify_all()
        for listener in self._listeners:
            listener(snap)
        for change_listener in self._change_listeners:
            change_listener(snap, changed)

    def request_progress(self) -> None:
        if self._watcher is not None:
            self._watcher.request_progress()

    def start(self) -> Replica:
        """Load, then follow changes in a background thread until :meth:`stop`."""
        if self._thread is not None:
            return self
        if self._watcher is None:
            self.load()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="replica-sync", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.pump(timeout=0.2)
            except KVError as e:
                if self._stopping.is_set():
                    return
                log.warning("replica: sync failed (%s); reloading", e)
                time.sleep(self._retry_delay)
                try:
                    self.load()
                except KVError:
                    continue

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._watcher = None

    def verify(self) -> list[str]:
        """Compare the replica with a fresh read at the same revision; returns the keys
        that differ (empty when in sync). A periodic guard against lost watch events."""
        snap = self._snap
        fresh = snapshot_from_kvs(
            self.keys, self.feed.load(self.keys.root, revision=snap.revision).kvs,
            snap.revision,
        )
        diffs = []
        for name in TABLES:
            mine, theirs = getattr(snap, name), getattr(fresh, name)
            for key in set(mine.keys()) | set(theirs.keys()):
                if _fingerprint(mine.get(key)) != _fingerprint(theirs.get(key)):
                    diffs.append(f"{name}/{key}")
        if snap.config != fresh.config:
            diffs.append("config")
        return sorted(diffs)

    def __enter__(self) -> Replica:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _fingerprint(record: object) -> object:
    if record is None:
        return None
    revision = getattr(record, "revision", None)
    if revision is None:
        revision = getattr(record, "seq", None)
    return (type(record).__name__, revision)

