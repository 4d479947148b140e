"""One watch on etcd, served to every subscriber of the sync stream.

The server's replica follows the cell with a single etcd watch; this cache keeps the
raw stored records it delivers and a window of recent change batches (wire messages
are built once, when a subscriber first needs them). A subscriber gets either the
whole cell at one revision followed by every later batch, or, when it resumes from a
revision the window still covers, just the batches from there. Subscribers that fall
too far behind are cut off and resume; nobody can make the cache (or etcd) buffer without bound.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterator

from cellstate.api.pb.v1 import cellstate_pb2 as pb
from cellstate.keys import Keyspace
from cellstate.kv.base import KeyValue
from cellstate.replica import Replica

SNAPSHOT_CHUNK = 1000  # records per snapshot message (well under gRPC's 4 MiB default)


class FellBehind(Exception):
    """The subscriber's queue passed its limit; it should resume from its revision."""


class Subscriber:
    def __init__(self, initial: list[pb.SyncResponse], limit: int, start: int = 0) -> None:
        self._initial = initial
        # A subscriber resuming from another server replica may be ahead of this one:
        # batches it has already seen are not sent again.
        self._start = start
        self._queue: queue.SimpleQueue[pb.SyncResponse | None] = queue.SimpleQueue()
        self._limit = limit
        self.closed = False
        self.overflowed = False

    def put(self, msg: pb.SyncResponse) -> None:
        if self.closed or msg.revision < self._start:
            return
        if self._queue.qsize() >= self._limit:
            self.overflowed = True
            self.close()
            return
        self._queue.put(msg)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put(None)

    def messages(self, poll: float = 1.0) -> Iterator[pb.SyncResponse]:
        """What to send, in order, until closed. Raises FellBehind on overflow.

        After ``poll`` seconds with nothing to send, a heartbeat (progress at the last
        revision sent) tells the client this server is alive, whatever etcd's progress
        notifications do: a client takes a silent stream for a hung server and moves to
        another one within a few seconds."""
        sent = 0
        for first in self._initial:
            sent = max(sent, first.revision)
            yield first
        self._initial = []
        while True:
            try:
                msg = self._queue.get(timeout=poll)
            except queue.Empty:
                if sent:
                    yield pb.SyncResponse(revision=sent)
                continue
            if msg is None:
                if self.overflowed:
                    raise FellBehind("the subscriber fell too far behind")
                return
            sent = max(sent, msg.revision)
            yield msg


class _Batch:
    """One change batch of the window: its raw records, and its wire message, built
    when a subscriber first needs it (with nobody subscribed, none is built)."""

    __slots__ = ("_msg", "changes", "revision")

    def __init__(self, revision: int, changes: list[tuple[bytes, KeyValue | None]]) -> None:
        self.revision = revision
        self.changes = changes
        self._msg: pb.SyncResponse | None = None

    def message(self, root_len: int) -> pb.SyncResponse:
        msg = self._msg
        if msg is None:
            msg = self._msg = pb.SyncResponse(
                revision=self.revision,
                records=[_record(root_len, k, kv, self.revision) for k, kv in self.changes])
        return msg


def _record(root_len: int, key: bytes, kv: KeyValue | None, revision: int) -> pb.Record:
    rel = key[root_len:].decode()
    if kv is None:
        return pb.Record(key=rel, deleted=True, mod_revision=revision)
    return pb.Record(key=rel, value=kv.value, mod_revision=kv.mod_revision,
                     create_revision=kv.create_revision)


class WatchCache:
    def __init__(self, replica: Replica, *, history: int = 20_000, queue_limit: int = 50_000,
                 ) -> None:
        self.keys: Keyspace = replica.keys
        self._root_len = len(self.keys.root)
        self._lock = threading.Lock()
        # The cell's stored records by key, as the watch delivered them: wire records
        # are built from them only for a subscriber's snapshot (the leader applies
        # thousands of records a second, most of which no snapshot ever sends). A plain
        # dict, updated in one call per batch, copied under the lock when a subscriber
        # needs a snapshot (rare: a scheduler starting or resuming from too far back);
        # an immutable map made every batch cost the commit leader's server about a
        # tenth of its CPU (py-spy, service_throughput.py with 4 processes).
        self._records: dict[bytes, KeyValue] = {}
        self._revision = 0
        # Change batches after _complete_from - 1, oldest first.
        self._history: collections.deque[_Batch] = collections.deque(maxlen=history)
        self._complete_from = 1
        self._subs: set[Subscriber] = set()
        self._queue_limit = queue_limit
        self.loaded = threading.Event()
        replica.on_records(self._on_records)

    @property
    def revision(self) -> int:
        return self._revision

    def _on_records(self, changes: list[tuple[bytes, KeyValue | None]], revision: int,
                    reset: bool) -> None:
        with self._lock:
            if reset:
                self._records = {k: kv for k, kv in changes if kv is not None}
                self._revision = revision
                self._history.clear()
                self._complete_from = revision + 1
                # Whoever followed the old history must start again from a snapshot.
                for sub in self._subs:
                    sub.close()
                self._subs.clear()
                self.loaded.set()
                return
            if not changes:
                if revision > self._revision:
                    self._revision = revision
                if self._subs:
                    progress = pb.SyncResponse(revision=revision)
                    for sub in self._subs:
                        sub.put(progress)
                return
            records = self._records
            if any(kv is None for _, kv in changes):
                for k, kv in changes:  # in order: a key may come and go in one batch
                    if kv is None:
                        records.pop(k, None)
                    else:
                        records[k] = kv
            else:
                records.update(changes)  # type: ignore[arg-type]  # no None among them
            self._revision = max(self._revision, revision)
            batch = _Batch(revision, changes)
            if len(self._history) == self._history.maxlen:
                self._complete_from = self._history[0].revision + 1
            self._history.append(batch)
            if self._subs:
                msg = batch.message(self._root_len)
                for sub in self._subs:
                    sub.put(msg)

    def subscribe(self, start_revision: int) -> Subscriber:
        """A subscriber that sees the cell from ``start_revision`` (0: a snapshot)."""
        with self._lock:
            if start_revision and start_revision >= self._complete_from:
                initial = [b.message(self._root_len) for b in self._history
                           if b.revision >= start_revision]
                snapshot = None
            else:
                snapshot, revision = dict(self._records), self._revision
                initial = []
            sub = Subscriber(initial, self._queue_limit, start_revision if snapshot is None else 0)
            self._subs.add(sub)
        if snapshot is not None:
            # Built outside the lock: later batches queue up behind it meanwhile.
            sub._initial = _snapshot_messages(snapshot, revision, self._root_len,
                                              reset=start_revision != 0)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            self._subs.discard(sub)
        sub.close()

    def close(self) -> None:
        with self._lock:
            subs, self._subs = self._subs, set()
        for sub in subs:
            sub.close()

    @property
    def subscribers(self) -> int:
        return len(self._subs)


def _snapshot_messages(records: dict[bytes, KeyValue], revision: int,
                       root_len: int, reset: bool) -> list[pb.SyncResponse]:
    values = [_record(root_len, k, kv, revision) for k, kv in records.items()]
    out = []
    for i in range(0, max(len(values), 1), SNAPSHOT_CHUNK):
        out.append(pb.SyncResponse(
            snapshot=True, reset=reset, revision=revision,
            records=values[i:i + SNAPSHOT_CHUNK],
            snapshot_done=i + SNAPSHOT_CHUNK >= len(values),
        ))
    return out
