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

import logging
import threading
import time
from collections.abc import Callable, Iterable
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
from cellstate.model import CellConfig, Machine
from cellstate.records import RECORDS

log = logging.getLogger(__name__)



def _apply(
    keys: Keyspace, snap: CellSnapshot, changes: Iterable[tuple[bytes, KeyValue | None]],
    revision: int, changed: list[tuple[KeyKind, str]] | None = None,
) -> CellSnapshot:
    """``snap`` with the changes of one or more whole revisions applied; the (kind, id)
    of each changed record is appended to ``changed`` if given (a change to one of a
    machine's allocations is a change to the machine)."""
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
        else:
            table[kind[1]] = rk.decode(kind[1], kv.value, kv.mod_revision)
    if machine_records or alloc_changes:
        _apply_machines(mutators["machines"], machine_records, alloc_changes, changed)
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
) -> None:
    for mid in records.keys() | alloc_changes.keys():
        old: Machine | None = machines.get(mid)
        if mid in records and records[mid] is None:
            machines.pop(mid, None)
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
        self._publish(_apply(self.keys, self._snap, changes, last, changed), changed)
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

