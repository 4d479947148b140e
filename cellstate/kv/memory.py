"""An in-process multi-version key-value store with etcd's semantics.

Not a mock: it keeps every key's history, so reads at a past revision, watches that
start in the past, compaction and lease expiry behave as etcd's do, and it enforces
etcd's request limits, so a transaction that etcd would refuse is refused here too.
The contract suite in ``tests/contract`` runs unchanged against this and a real etcd.

The clock is injected (leases expire against it), so the simulator can run the store
on virtual time.
"""

from __future__ import annotations

import bisect
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import attrs

from cellstate.kv.base import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TXN_OPS,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Delete,
    DuplicateKeyError,
    EventType,
    FutureRevisionError,
    Get,
    GetChanged,
    KeyValue,
    LeaseNotFoundError,
    Op,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
    TxnTooLargeError,
    WatchDroppedError,
    WatchEvent,
    WatchResponse,
)

# Per-op framing that etcd's protobuf encoding adds on top of keys and values; only
# used to judge max_request_bytes the way etcd would, within a few percent.
_OP_OVERHEAD_BYTES = 8


@attrs.define(slots=True)
class _Lease:
    ttl: int
    expires_at: float
    keys: set[bytes] = attrs.field(factory=set)


def _in_range(key: bytes, start: bytes, end: bytes | None) -> bool:
    if end is None:
        return key == start
    if end == b"\x00":
        return key >= start
    return start <= key < end


def _with_revision(
    responses: Sequence[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None], revision: int
) -> tuple[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None, ...]:
    return tuple(
        TxnResult(r.succeeded, revision, _with_revision(r.responses, revision))
        if isinstance(r, TxnResult) else r
        for r in responses
    )


class MemoryWatcher:
    """A watch on a :class:`MemoryKV`: responses are queued as transactions commit."""

    def __init__(self, store: MemoryKV, start: bytes, end: bytes | None) -> None:
        self._store = store
        self.start = start
        self.end = end
        self._queue: queue.Queue[WatchResponse | None] = queue.Queue()
        self._dropped = False
        self._canceled = False

    def matches(self, key: bytes) -> bool:
        return _in_range(key, self.start, self.end)

    def deliver(self, response: WatchResponse) -> None:
        self._queue.put(response)

    def drop(self) -> None:
        """Break the stream as a network failure would (for tests)."""
        self._dropped = True
        self._queue.put(None)

    def next(self, timeout: float | None = None) -> WatchResponse | None:
        try:
            item = self._queue.get(block=timeout is None or timeout > 0, timeout=timeout)
        except queue.Empty:
            return None
        if item is None:
            if self._dropped:
                raise WatchDroppedError("watch stream dropped")
            return None
        return item

    def request_progress(self) -> None:
        self._store._progress(self)

    def cancel(self) -> None:
        if not self._canceled:
            self._canceled = True
            self._store._remove_watcher(self)
            self._queue.put(None)


class MemoryKV:
    """etcd's KV, Watch and Lease semantics in memory. Thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self._clock = clock
        self._lock = threading.RLock()
        self._revision = 1  # etcd starts at 1 with an empty keyspace
        self._compacted = 0
        self._current: dict[bytes, KeyValue] = {}
        # Every key that has history (live or deleted since the last compaction), sorted.
        self._keys: list[bytes] = []
        # key -> [(revision, kv or None for a delete)], oldest first.
        self._history: dict[bytes, list[tuple[int, KeyValue | None]]] = {}
        self._watchers: list[MemoryWatcher] = []
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 0x1000

    # -- reads ---------------------------------------------------------------

    @property
    def revision(self) -> int:
        with self._lock:
            self._expire_leases()
            return self._revision

    def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        revision: int = 0,
        limit: int = 0,
        keys_only: bool = False,
    ) -> RangeResult:
        with self._lock:
            self._expire_leases()
            at = self._check_read_revision(revision)
            kvs = list(self._scan(key, range_end, at))
            count = len(kvs)
            more = bool(limit) and count > limit
            if more:
                kvs = kvs[:limit]
            if keys_only:
                kvs = [kv._replace(value=b"") for kv in kvs]
            return RangeResult(tuple(kvs), self._revision, more, count)

    def _check_read_revision(self, revision: int) -> int:
        if revision <= 0:
            return self._revision
        if revision > self._revision:
            raise FutureRevisionError(
                f"required revision {revision} is a future revision (current {self._revision})"
            )
        if revision < self._compacted:
            raise CompactedError(self._compacted)
        return revision

    def _scan(self, key: bytes, range_end: bytes | None, at: int) -> Iterable[KeyValue]:
        if range_end is None:
            kv = self._value_at(key, at)
            return [kv] if kv is not None else []
        lo = bisect.bisect_left(self._keys, key)
        hi = len(self._keys) if range_end == b"\x00" else bisect.bisect_left(self._keys, range_end)
        out = []
        for k in self._keys[lo:hi]:
            kv = self._value_at(k, at)
            if kv is not None:
                out.append(kv)
        return out

    def _value_at(self, key: bytes, at: int) -> KeyValue | None:
        if at == self._revision:
            return self._current.get(key)
        history = self._history.get(key)
        if not history:
            return None
        i = bisect.bisect_right(history, at, key=lambda entry: entry[0])
        return history[i - 1][1] if i else None

    # -- writes --------------------------------------------------------------

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        self._check_limits(compares, success, failure)
        with self._lock:
            self._expire_leases()
            ok = all(self._compare(c) for c in compares)
            branch = success if ok else failure
            for op in branch:
                if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                    raise LeaseNotFoundError(f"lease {op.lease:x} not found")
            responses, writes = self._apply(branch)
            revision = self._publish(writes) if writes else self._revision
            return TxnResult(ok, revision, _with_revision(responses, revision))

    def _check_limits(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> None:
        biggest = max(len(compares), len(success), len(failure))
        if biggest > self.max_txn_ops:
            raise TxnTooLargeError(
                f"too many operations in txn request ({biggest} > {self.max_txn_ops})"
            )
        if self._request_size(compares, success, failure) > self.max_request_bytes:
            raise TxnTooLargeError(
                f"request is too large (> {self.max_request_bytes} bytes)"
            )
        for branch in (success, failure):
            self._check_branch(branch, set(), self.max_txn_ops - biggest)

    def _request_size(self, compares: Sequence[Compare], success: Sequence[Op],
                      failure: Sequence[Op]) -> int:
        size = sum(len(c.key) + _OP_OVERHEAD_BYTES for c in compares)
        for op in (*success, *failure):
            if isinstance(op, TxnOp):
                size += self._request_size(op.compares, op.success, op.failure)
                continue
            size += len(op.key) + _OP_OVERHEAD_BYTES
            if isinstance(op, Put):
                size += len(op.value)
            elif op.range_end:
                size += len(op.range_end)
        return size

    def _check_branch(self, branch: Sequence[Op], written: set[bytes], budget: int) -> None:
        """etcd refuses a key written twice on any path through a request, nested
        transactions included, and checks the op limit at every level: a nested
        transaction may use only what its parent's largest list leaves (``budget``)."""
        for op in branch:
            if isinstance(op, TxnOp):
                biggest = max(len(op.compares), len(op.success), len(op.failure))
                if biggest > budget:
                    raise TxnTooLargeError(
                        f"too many operations in txn request ({biggest} > {budget} left "
                        "for a nested transaction)"
                    )
                self._check_branch(op.success, written, budget - biggest)
                self._check_branch(op.failure, written, budget - biggest)
                continue
            if isinstance(op, Put | Delete) and op.key in written:
                raise DuplicateKeyError("duplicate key given in txn request")
            if isinstance(op, Put) or (isinstance(op, Delete) and not op.range_end):
                written.add(op.key)

    def _compare(self, c: Compare) -> bool:
        if c.range_end is not None:
            kvs = list(self._scan(c.key, c.range_end, self._revision))
            return all(self._compare_one(c, kv) for kv in kvs)
        return self._compare_one(c, self._current.get(c.key))

    @staticmethod
    def _compare_one(c: Compare, kv: KeyValue | None) -> bool:
        actual: int | bytes
        if c.target is CompareTarget.VALUE:
            if kv is None:
                return False
            actual = kv.value
        elif kv is None:
            actual = 0
        else:
            actual = {
                CompareTarget.MOD: kv.mod_revision,
                CompareTarget.VERSION: kv.version,
                CompareTarget.CREATE: kv.create_revision,
                CompareTarget.LEASE: kv.lease,
            }[c.target]
        expected = c.value
        if isinstance(actual, bytes) != isinstance(expected, bytes):
            return False
        if c.result is CompareResult.EQUAL:
            return actual == expected
        if c.result is CompareResult.NOT_EQUAL:
            return actual != expected
        if c.result is CompareResult.GREATER:
            return actual > expected  # type: ignore[operator]
        return actual < expected  # type: ignore[operator]

    def _apply(
        self, branch: Sequence[Op]
    ) -> tuple[list[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None],
               list[tuple[EventType, bytes, Put | None]]]:
        """Reads are answered at the state before this transaction's writes. The store
        never mixes reads and writes in one branch, so where etcd differs (a read after a
        write in the same branch sees it) does not matter."""
        responses: list[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None] = []
        writes: list[tuple[EventType, bytes, Put | None]] = []
        for op in branch:
            if isinstance(op, TxnOp):
                ok = all(self._compare(c) for c in op.compares)
                inner, inner_writes = self._apply(op.success if ok else op.failure)
                writes.extend(inner_writes)
                # The revision is filled in by the caller once it is known.
                responses.append(TxnResult(ok, -1, tuple(inner)))
            elif isinstance(op, Get):
                responses.append(tuple(self._scan(op.key, op.range_end, self._revision)))
            elif isinstance(op, GetChanged):
                kvs = list(self._scan(op.key, op.range_end, self._revision))
                changed = tuple(kv for kv in kvs if kv.mod_revision >= op.since)
                responses.append(RangeResult(changed, self._revision, False, len(kvs)))
            elif isinstance(op, Put):
                writes.append((EventType.PUT, op.key, op))
                responses.append(None)
            else:
                if op.range_end is None:
                    doomed = [op.key] if op.key in self._current else []
                else:
                    doomed = [kv.key for kv in self._scan(op.key, op.range_end, self._revision)]
                writes.extend((EventType.DELETE, k, None) for k in doomed)
                responses.append(len(doomed))
        return responses, writes

    def _publish(self, writes: list[tuple[EventType, bytes, Put | None]]) -> int:
        """Apply the writes of one transaction as one new revision and notify watchers."""
        self._revision += 1
        rev = self._revision
        events: list[WatchEvent] = []
        for kind, key, put in writes:
            prev = self._current.get(key)
            if kind is EventType.PUT:
                assert put is not None
                if prev is not None and prev.lease and prev.lease != put.lease:
                    self._detach(prev.lease, key)
                kv = KeyValue(
                    key,
                    put.value,
                    prev.create_revision if prev else rev,
                    rev,
                    prev.version + 1 if prev else 1,
                    put.lease,
                )
                self._current[key] = kv
                if put.lease:
                    self._leases[put.lease].keys.add(key)
                self._record(key, rev, kv)
                events.append(WatchEvent(EventType.PUT, kv))
            else:
                if prev is None:
                    continue
                if prev.lease:
                    self._detach(prev.lease, key)
                del self._current[key]
                self._record(key, rev, None)
                events.append(WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, rev, 0)))
        response = WatchResponse(rev, tuple(events))
        for watcher in self._watchers:
            mine = tuple(e for e in events if watcher.matches(e.kv.key))
            if mine:
                watcher.deliver(attrs.evolve(response, events=mine))
        return rev

    def _record(self, key: bytes, rev: int, kv: KeyValue | None) -> None:
        history = self._history.get(key)
        if history is None:
            self._history[key] = [(rev, kv)]
            bisect.insort(self._keys, key)
        else:
            history.append((rev, kv))

    def _detach(self, lease_id: int, key: bytes) -> None:
        lease = self._leases.get(lease_id)
        if lease is not None:
            lease.keys.discard(key)

    # -- compaction ----------------------------------------------------------

    def compact(self, revision: int) -> None:
        with self._lock:
            if revision > self._revision:
                raise FutureRevisionError(
                    f"required revision {revision} is a future revision"
                )
            if revision <= self._compacted:
                raise CompactedError(self._compacted)
            self._compacted = revision
            gone = []
            for key, history in self._history.items():
                i = bisect.bisect_right(history, revision, key=lambda entry: entry[0])
                # Keep the newest entry at or below the compacted revision: it is the
                # value a read at that revision must still see.
                del history[: max(i - 1, 0)]
                if len(history) == 1 and history[0][1] is None and history[0][0] <= revision:
                    gone.append(key)
            for key in gone:
                del self._history[key]
                self._keys.pop(bisect.bisect_left(self._keys, key))

    @property
    def compact_revision(self) -> int:
        return self._compacted

    # -- watches -------------------------------------------------------------

    def watch(
        self, key: bytes, range_end: bytes | None = None, *, start_revision: int = 0
    ) -> MemoryWatcher:
        with self._lock:
            self._expire_leases()
            watcher = MemoryWatcher(self, key, range_end)
            if start_revision and start_revision < self._compacted:
                watcher.deliver(
                    WatchResponse(self._revision, compact_revision=self._compacted, canceled=True)
                )
                return watcher
            if start_revision and start_revision <= self._revision:
                for response in self._replay(watcher, start_revision):
                    watcher.deliver(response)
            self._watchers.append(watcher)
            return watcher

    def _replay(self, watcher: MemoryWatcher, start: int) -> list[WatchResponse]:
        by_rev: dict[int, list[WatchEvent]] = {}
        lo = bisect.bisect_left(self._keys, watcher.start)
        if watcher.end is None:
            keys = [watcher.start] if watcher.start in self._history else []
        elif watcher.end == b"\x00":
            keys = self._keys[lo:]
        else:
            keys = self._keys[lo : bisect.bisect_left(self._keys, watcher.end)]
        for k in keys:
            for rev, kv in self._history[k]:
                if rev >= start:
                    event = (
                        WatchEvent(EventType.PUT, kv)
                        if kv is not None
                        else WatchEvent(EventType.DELETE, KeyValue(k, b"", 0, rev, 0))
                    )
                    by_rev.setdefault(rev, []).append(event)
        return [WatchResponse(rev, tuple(evs)) for rev, evs in sorted(by_rev.items())]

    def _progress(self, watcher: MemoryWatcher) -> None:
        with self._lock:
            self._expire_leases()
            if watcher in self._watchers:
                watcher.deliver(WatchResponse(self._revision))

    def _remove_watcher(self, watcher: MemoryWatcher) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def drop_watches(self) -> None:
        """Break every open watch stream, as a lost connection would (for tests)."""
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for w in watchers:
            w.drop()

    # -- leases --------------------------------------------------------------

    def lease_grant(self, ttl: int) -> int:
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl}")
        with self._lock:
            self._expire_leases()
            self._next_lease += 1
            self._leases[self._next_lease] = _Lease(ttl, self._clock() + ttl)
            return self._next_lease

    def lease_keepalive(self, lease_id: int) -> int:
        with self._lock:
            self._expire_leases()
            lease = self._leases.get(lease_id)
            if lease is None:
                raise LeaseNotFoundError(f"lease {lease_id:x} not found")
            lease.expires_at = self._clock() + lease.ttl
            return lease.ttl

    def lease_keys(self, lease_id: int) -> tuple[bytes, ...]:
        with self._lock:
            self._expire_leases()
            lease = self._leases.get(lease_id)
            if lease is None:
                raise LeaseNotFoundError(f"lease {lease_id:x} not found")
            return tuple(sorted(lease.keys))

    def lease_revoke(self, lease_id: int) -> None:
        with self._lock:
            self._expire_leases()
            if lease_id not in self._leases:
                raise LeaseNotFoundError(f"lease {lease_id:x} not found")
            self._end_lease(lease_id)

    def expire_leases(self) -> None:
        """Expire every lease whose time has passed (also done on every operation)."""
        with self._lock:
            self._expire_leases()

    def _expire_leases(self) -> None:
        if not self._leases:
            return
        now = self._clock()
        for lease_id in [i for i, lease in self._leases.items() if lease.expires_at <= now]:
            self._end_lease(lease_id)

    def _end_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        doomed = sorted(lease.keys)
        if doomed:
            self._publish([(EventType.DELETE, k, None) for k in doomed])

    def close(self) -> None:
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for w in watchers:
            w.cancel()
