"""The key-value contract the cell-state store is built on.

It is the part of etcd v3's data model the store relies on, stated once so that two
implementations can honour it: :class:`cellstate.kv.etcd.EtcdKV` (a real etcd) and
:class:`cellstate.kv.memory.MemoryKV` (in-process, for unit tests and the simulator).
The shared contract suite (``tests/contract``) runs unchanged against both.

Semantics (as etcd defines them):

* One global *revision* counter. Every successful write transaction that changes at
  least one key increments it by exactly one, and every key it writes gets that
  revision as its ``mod_revision``. A transaction that writes nothing (only reads, or
  deletes of absent keys) does not advance it.
* ``create_revision`` is the revision that created the key's current incarnation;
  ``version`` counts writes since then (1 after creation); deleting resets all three.
* A compare on an absent key sees ``mod_revision == version == create_revision == 0``
  and any ``value`` compare is false. So ``mod_revision == 0`` guards create-if-absent.
* A transaction is checked against ``max_txn_ops`` per list (the largest of compares,
  success ops, failure ops; not their sum), ``max_request_bytes`` for the whole
  request, and rejects a key written twice in one branch.
* Reads may name a past revision; one below the compacted revision raises
  :class:`CompactedError`.
* Watches deliver every change in revision order, batched by revision (all events of
  one transaction arrive in one response). A watch that starts below the compacted
  revision is cancelled with ``compact_revision`` set. A lost stream is signalled
  by :class:`WatchDroppedError`; the watcher resumes from its last revision + 1.
* Leases expire ``ttl`` seconds after their last keep-alive; expiry deletes every key
  attached to the lease in one revision.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import attrs

from cellstate.errors import (
    AuthError as AuthError,
    CompactedError as CompactedError,
    DuplicateKeyError as DuplicateKeyError,
    FutureRevisionError as FutureRevisionError,
    KVError as KVError,
    LeaseNotFoundError as LeaseNotFoundError,
    TxnTooLargeError as TxnTooLargeError,
    UnavailableError as UnavailableError,
    WatchDroppedError as WatchDroppedError,
)

DEFAULT_MAX_TXN_OPS = 128
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024  # etcd's --max-request-bytes default (1.5 MiB)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix`` (etcd's rule)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every key from prefix on


# KeyValue, Compare and WatchEvent are named tuples, not attrs classes: the commit
# leader builds about 300 of them a commit (every watch event, every guard), and a
# named tuple is built in about a third of the time of a frozen attrs instance.
class KeyValue(NamedTuple):
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class CompareTarget(enum.Enum):
    MOD = "mod"
    VERSION = "version"
    CREATE = "create"
    VALUE = "value"
    LEASE = "lease"


class CompareResult(enum.Enum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    GREATER = ">"
    LESS = "<"


class Compare(NamedTuple):
    """``target(key) <op> value``; for a range compare set ``range_end``."""

    key: bytes
    target: CompareTarget
    result: CompareResult
    value: int | bytes
    range_end: bytes | None = None

    @staticmethod
    def mod_revision_is(key: bytes, revision: int) -> Compare:
        # Hot path (a guard per record a commit read): no enum lookups per call.
        return Compare(key, _MOD, _EQUAL, revision)

    @staticmethod
    def absent(key: bytes) -> Compare:
        return Compare(key, _MOD, _EQUAL, 0)


_MOD = CompareTarget.MOD
_EQUAL = CompareResult.EQUAL


@attrs.frozen(slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@attrs.frozen(slots=True)
class Delete:
    """Delete ``key``, or every key in ``[key, range_end)``."""

    key: bytes
    range_end: bytes | None = None


@attrs.frozen(slots=True)
class Get:
    """A read inside a transaction, seen at the transaction's revision."""

    key: bytes
    range_end: bytes | None = None


@attrs.frozen(slots=True)
class GetChanged:
    """A read inside a transaction of the keys of ``key`` (or ``[key, range_end)``)
    modified at or after revision ``since`` (>= 1), answered by a :class:`RangeResult`
    whose ``kvs`` are those keys and whose ``count`` is how many keys the range holds,
    changed or not (etcd's ``min_mod_revision``: the server filters, the count is the
    range's). A reader that holds the range as of ``since - 1`` learns what changed,
    and from the count whether any key it holds was deleted, without the unchanged
    values coming back."""

    key: bytes
    range_end: bytes | None
    since: int


@attrs.frozen(slots=True)
class TxnOp:
    """A transaction nested in a transaction's branch (etcd >= 3.3): its own compares
    decide which of its own branches runs; every nested transaction that runs is part
    of the outer one's single revision. Answered by a :class:`TxnResult`."""

    compares: tuple[Compare, ...]
    success: tuple[Put | Delete | Get | GetChanged, ...]
    failure: tuple[Put | Delete | Get | GetChanged, ...] = ()


Op = Put | Delete | Get | GetChanged | TxnOp


@attrs.frozen(slots=True)
class TxnResult:
    """``responses[i]`` answers op ``i`` of the branch that ran: for :class:`Get` the
    list of key-values, for :class:`GetChanged` a :class:`RangeResult`, for
    :class:`Delete` the number deleted, for :class:`Put` None, for a nested
    :class:`TxnOp` its own TxnResult.
    ``revision`` is the store revision after the transaction (etcd's header revision)."""

    succeeded: bool
    revision: int
    responses: tuple[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None, ...]


@attrs.frozen(slots=True)
class RangeResult:
    kvs: tuple[KeyValue, ...]
    revision: int  # the revision the read was served at
    more: bool = False
    count: int = 0


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


class WatchEvent(NamedTuple):
    """For a delete, ``kv.value`` is empty and ``kv.mod_revision`` is the delete's
    revision (as etcd reports it)."""

    type: EventType
    kv: KeyValue


@attrs.frozen(slots=True)
class WatchResponse:
    """One message from a watch: the events of one or more whole revisions, or a
    progress notification (no events, ``revision`` is a revision the watch has caught
    up to), or a cancellation because history was compacted (``compact_revision``)."""

    revision: int
    events: tuple[WatchEvent, ...] = ()
    compact_revision: int = 0
    canceled: bool = False

    @property
    def is_progress(self) -> bool:
        return not self.events and not self.canceled










class Watcher(Protocol):
    def next(self, timeout: float | None = None) -> WatchResponse | None:
        """The next response, or None when ``timeout`` passes first.

        Raises :class:`WatchDroppedError` when the stream is lost."""

    def request_progress(self) -> None:
        """Ask for a progress notification (answered as a response with no events)."""

    def cancel(self) -> None: ...


class KV(Protocol):
    """The operations of etcd's KV, Watch and Lease services the store uses."""

    max_txn_ops: int
    max_request_bytes: int

    def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        revision: int = 0,
        limit: int = 0,
        keys_only: bool = False,
    ) -> RangeResult: ...

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult: ...

    def watch(
        self, key: bytes, range_end: bytes | None = None, *, start_revision: int = 0
    ) -> Watcher: ...

    def compact(self, revision: int) -> None: ...

    def lease_grant(self, ttl: int) -> int: ...

    def lease_keepalive(self, lease_id: int) -> int:
        """Refresh the lease; returns its TTL, or raises LeaseNotFoundError if it expired."""

    def lease_revoke(self, lease_id: int) -> None: ...

    def lease_keys(self, lease_id: int) -> tuple[bytes, ...]:
        """The keys attached to the lease, sorted; raises LeaseNotFoundError if it
        expired. (Who holds a lease is told by its keys: cellstate/api/auth.py.)"""

    def close(self) -> None: ...


def range_all(kv: KV, prefix: bytes, *, revision: int = 0, page: int = 2000) -> RangeResult:
    """Every key under ``prefix`` at one revision, read in pages so that no single
    response exceeds the gRPC message limit."""
    first = kv.range(prefix, prefix_end(prefix), revision=revision, limit=page)
    kvs = list(first.kvs)
    # The response header carries the store's current revision, not the one read at.
    at = revision or first.revision
    more = first.more
    end = prefix_end(prefix)
    while more and kvs:
        nxt = kv.range(kvs[-1].key + b"\x00", end, revision=at, limit=page)
        kvs.extend(nxt.kvs)
        more = nxt.more
    return RangeResult(tuple(kvs), at, False, len(kvs))
