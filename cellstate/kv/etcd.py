"""The KV contract (:mod:`cellstate.kv.base`) over a real etcd v3 server.

:class:`EtcdKV` talks to etcd through the thin gRPC stubs in :mod:`cellstate.kv.etcdpb`
(generated from the hand-written subset of etcd's API in ``protos/etcd``), with
synchronous grpcio. It adds what no Python etcd library does together: several
endpoints with failover, error mapping onto :mod:`cellstate.kv.base`'s exceptions,
password auth with re-login on an expired token (also without TLS), TLS, large
messages, reads at past revisions, and watches that surface progress notifications,
compaction cancels and dropped streams (see :class:`EtcdWatcher`).

Thread safety: one :class:`EtcdKV` may be shared by any number of threads. gRPC channels
and their method callables are thread-safe; the little mutable state here (the endpoint
in use, the auth token, the set of open watchers) is guarded by locks or replaced
atomically.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Self, TypeVar

import attrs
import grpc

from cellstate.errors import EtcdAuthError as EtcdAuthError
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
    KVError,
    LeaseNotFoundError,
    Op,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
    TxnTooLargeError,
    UnavailableError,
    WatchDroppedError,
    WatchEvent,
    WatchResponse,
)
from cellstate.kv.etcdpb.authpb import auth_pb2
from cellstate.kv.etcdpb.etcdserverpb import rpc_pb2 as pb, rpc_pb2_grpc as pb_grpc
from cellstate.kv.etcdpb.mvccpb import kv_pb2 as mvccpb

__all__ = [
    "EtcdAlarm",
    "EtcdAuthError",
    "EtcdKV",
    "EtcdNoSpaceError",
    "EtcdWatcher",
    "MemberStatus",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MiB: Final = 1024 * 1024
# gRPC's client default is 4 MiB, which a range over a few thousand machine records
# exceeds; 64 MiB keeps large reads working (range_all pages anyway).
MAX_RECEIVE_BYTES: Final = 64 * MiB

_CHANNEL_OPTIONS: Final = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    # No client-side send limit: the server's --max-request-bytes decides, and its
    # "request is too large" maps to TxnTooLargeError (a client-side limit would give a
    # different, less clear error).
    ("grpc.max_send_message_length", -1),
    # After a server restart the channel must reconnect quickly; gRPC's default backoff
    # (1 s growing to 120 s) would keep failing calls long after the server is back.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Detect a silently dead server under a long-lived watch. etcd refuses pings more
    # often than every 5 s (--grpc-keepalive-min-time) and pings without any call.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
)

_OK: Final = grpc.StatusCode.OK
_UNAVAILABLE: Final = grpc.StatusCode.UNAVAILABLE
_UNAUTHENTICATED: Final = grpc.StatusCode.UNAUTHENTICATED
_DEADLINE_EXCEEDED: Final = grpc.StatusCode.DEADLINE_EXCEEDED
_CANCELLED: Final = grpc.StatusCode.CANCELLED

_COMPARE_TARGETS: Final[dict[CompareTarget, tuple[pb.Compare.CompareTarget, str]]] = {
    CompareTarget.MOD: (pb.Compare.MOD, "mod_revision"),
    CompareTarget.VERSION: (pb.Compare.VERSION, "version"),
    CompareTarget.CREATE: (pb.Compare.CREATE, "create_revision"),
    CompareTarget.VALUE: (pb.Compare.VALUE, "value"),
    CompareTarget.LEASE: (pb.Compare.LEASE, "lease"),
}
_COMPARE_RESULTS: Final[dict[CompareResult, pb.Compare.CompareResult]] = {
    CompareResult.EQUAL: pb.Compare.EQUAL,
    CompareResult.NOT_EQUAL: pb.Compare.NOT_EQUAL,
    CompareResult.GREATER: pb.Compare.GREATER,
    CompareResult.LESS: pb.Compare.LESS,
}
_EVENT_DELETE: Final = mvccpb.Event.DELETE
_MOD: Final = CompareTarget.MOD
_EQUAL: Final = CompareResult.EQUAL
_PB_MOD: Final = pb.Compare.MOD
_PB_EQUAL: Final = pb.Compare.EQUAL

# Substrings of etcd's error messages (etcd's api/v3rpc/rpctypes), stable since 3.0.
_MSG_COMPACTED: Final = "required revision has been compacted"
_MSG_FUTURE: Final = "required revision is a future revision"
_MSG_TOO_MANY_OPS: Final = "too many operations in txn request"
_MSG_TOO_LARGE: Final = "request is too large"
_MSG_GRPC_TOO_LARGE: Final = "larger than max"  # gRPC's own receive limit on the server
_MSG_DUPLICATE: Final = "duplicate key given in txn request"
_MSG_LEASE_NOT_FOUND: Final = "requested lease not found"
_MSG_INVALID_TOKEN: Final = "invalid auth token"
_MSG_AUTH_OLD_REVISION: Final = "revision of auth store is old"
_MSG_USER_EMPTY: Final = "user name is empty"
_MSG_AUTH_FAILED: Final = "authentication failed"
_MSG_AUTH_NOT_ENABLED: Final = "authentication is not enabled"
_MSG_PERMISSION_DENIED: Final = "permission denied"
_MSG_USER_EXISTS: Final = "user name already exists"
_MSG_ROLE_EXISTS: Final = "role name already exists"
_MSG_NO_SPACE: Final = "database space exceeded"

# Failover: first try every endpoint once without waiting, then back off between rounds.
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 0.5
# With more than one endpoint, how long one attempt may wait for an answer before the
# call moves on: a member that stalls (paused, partitioned) holds the connection open
# without answering, and neither UNAVAILABLE nor the keep-alive (40 s) would move it.
DEFAULT_ATTEMPT_TIMEOUT: Final = 2.0



class EtcdNoSpaceError(KVError):
    """etcd refused a write because its backend reached ``--quota-backend-bytes`` (the
    NOSPACE alarm): the cluster takes only reads and deletes until the space is freed
    (compaction, defragmentation) and the alarm is disarmed
    (:mod:`cellstate.maintenance` does all three)."""


@attrs.frozen
class MemberStatus:
    """One etcd member's Maintenance.Status, as :meth:`EtcdKV.member_status` reads it."""

    endpoint: str
    member_id: int
    leader: int  # the member this one believes leads (0: none)
    db_size: int  # bytes the backend file takes (what the quota counts)
    db_size_in_use: int  # bytes in use; the rest is free pages a defragmentation returns
    revision: int
    raft_term: int
    version: str
    errors: tuple[str, ...] = ()

    @property
    def is_leader(self) -> bool:
        return self.member_id != 0 and self.member_id == self.leader

    @property
    def free_bytes(self) -> int:
        return max(0, self.db_size - self.db_size_in_use)


@attrs.frozen
class EtcdAlarm:
    """A raised etcd alarm: ``kind`` is ``"NOSPACE"`` or ``"CORRUPT"``."""

    member_id: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind} on member {self.member_id:x}"


class _Endpoint:
    """One endpoint's channel and the method callables on it (all thread-safe)."""

    __slots__ = ("address", "auth", "channel", "kv", "lease", "maintenance", "watch")

    def __init__(self, address: str, credentials: Any | None) -> None:
        self.address = address
        if credentials is None:
            self.channel: Any = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            self.channel = grpc.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        # The generated stubs are untyped; their attributes are gRPC multi-callables.
        self.kv: Any = pb_grpc.KVStub(self.channel)  # type: ignore[no-untyped-call]
        self.watch: Any = pb_grpc.WatchStub(self.channel)  # type: ignore[no-untyped-call]
        self.lease: Any = pb_grpc.LeaseStub(self.channel)  # type: ignore[no-untyped-call]
        self.maintenance: Any = pb_grpc.MaintenanceStub(self.channel)  # type: ignore[no-untyped-call]
        self.auth: Any = pb_grpc.AuthStub(self.channel)  # type: ignore[no-untyped-call]


def _strip_scheme(endpoint: str) -> tuple[str, bool]:
    """``"https://h:p"`` -> (``"h:p"``, True); a bare ``"h:p"`` is plain unless TLS is
    configured."""
    for scheme, tls in (("http://", False), ("https://", True)):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/"), tls
    return endpoint, False


def _kv(kv: mvccpb.KeyValue) -> KeyValue:
    return KeyValue(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def _kvs(kvs: Any) -> tuple[KeyValue, ...]:
    return tuple(
        [
            KeyValue(k.key, k.value, k.create_revision, k.mod_revision, k.version, k.lease)
            for k in kvs
        ]
    )


def _events(events: Any) -> tuple[WatchEvent, ...]:
    out = []
    for ev in events:
        kv = ev.kv
        if ev.type == _EVENT_DELETE:
            # etcd sends a tombstone: key + the delete's revision as mod_revision. State
            # the rest explicitly so a delete looks the same from every backend.
            out.append(
                WatchEvent(EventType.DELETE, KeyValue(kv.key, b"", 0, kv.mod_revision, 0, 0))
            )
        else:
            out.append(WatchEvent(EventType.PUT, _kv(kv)))
    return tuple(out)


def _add_ops(target: Any, ops: Sequence[Op]) -> bool:
    """Append ``ops`` to a repeated RequestOp field, building the messages in place
    (about 3x cheaper than constructing sub-messages and copying them in). Returns
    whether every op was a Put (then the results need not be looked at)."""
    add = target.add
    only_puts = True
    for op in ops:
        if type(op) is Put:
            put = add().request_put
            put.key = op.key
            put.value = op.value
            if op.lease:
                put.lease = op.lease
        elif type(op) is Delete:
            only_puts = False
            dele = add().request_delete_range
            dele.key = op.key
            if op.range_end is not None:
                dele.range_end = op.range_end
        elif type(op) is Get:
            only_puts = False
            rng = add().request_range
            rng.key = op.key
            if op.range_end is not None:
                rng.range_end = op.range_end
        elif type(op) is GetChanged:
            only_puts = False
            rng = add().request_range
            rng.key = op.key
            if op.range_end is not None:
                rng.range_end = op.range_end
            rng.min_mod_revision = op.since
        elif type(op) is TxnOp:
            only_puts = False
            nested = add().request_txn
            _add_compares(nested.compare, op.compares)
            _add_ops(nested.success, op.success)
            _add_ops(nested.failure, op.failure)
        else:
            raise TypeError(f"not a transaction op: {op!r}")
    return only_puts


def _add_compares(target: Any, compares: Sequence[Compare]) -> None:
    add_compare = target.add
    for cmp in compares:
        c = add_compare()
        c.key = cmp.key
        if cmp.target is _MOD and cmp.result is _EQUAL:  # a guard: most compares
            c.target = _PB_MOD
            c.result = _PB_EQUAL
            c.mod_revision = cmp.value
        else:
            c.result = _COMPARE_RESULTS[cmp.result]
            kind, field = _COMPARE_TARGETS[cmp.target]
            c.target = kind
            setattr(c, field, cmp.value)
        if cmp.range_end is not None:
            c.range_end = cmp.range_end


def _op_results(
    ops: Sequence[Op], responses: Any, revision: int
) -> tuple[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None, ...]:
    out: list[tuple[KeyValue, ...] | int | TxnResult | RangeResult | None] = []
    for op, resp in zip(ops, responses, strict=True):
        if type(op) is Put:
            out.append(None)
        elif type(op) is GetChanged:
            rr = resp.response_range
            out.append(RangeResult(_kvs(rr.kvs), revision, rr.more, rr.count))
        elif type(op) is Delete:
            out.append(resp.response_delete_range.deleted)
        elif type(op) is TxnOp:
            inner = resp.response_txn
            ok = inner.succeeded
            branch = op.success if ok else op.failure
            if all(type(o) is Put for o in branch):  # nothing to read back
                out.append(TxnResult(ok, revision, (None,) * len(branch)))
            else:
                out.append(TxnResult(ok, revision, _op_results(branch, inner.responses,
                                                                revision)))
        else:
            out.append(_kvs(resp.response_range.kvs))
    return tuple(out)


def _handshake_hint(error: str) -> str:
    """Why a TLS handshake failed, in words: gRPC reports etcd's refusal of a client
    certificate only as an SSL alert."""
    if "CERTIFICATE" in error or "andshake" in error:
        return (" (the TLS handshake failed: etcd takes only clients with a certificate "
                "its --trusted-ca-file signed, and the client takes only an etcd "
                "certificate its CA signed for the address dialled)")
    return ""


def _describe(err: Any) -> str:
    return f"{err.code().name}: {err.details()}"


class EtcdKV:
    """The :class:`cellstate.kv.base.KV` protocol over etcd v3 (gRPC, synchronous).

    ``endpoints`` are ``"host:port"`` (an ``http://`` or ``https://`` prefix is accepted;
    ``https://`` or any TLS material below turns TLS on). One gRPC channel is kept per
    endpoint; calls go to one endpoint until it answers UNAVAILABLE, then move on to the
    next, trying every endpoint once at once and then backing off (50 ms doubling to
    0.5 s). With more than one endpoint an attempt that gets no answer within
    ``attempt_timeout`` seconds moves on too (a stalled member: paused or partitioned,
    its connection open), and each round of endpoints that all missed it doubles the
    wait, so a slow answer still comes in time. Every call, retries included, ends
    within about ``timeout`` seconds; when no endpoint answered it raises
    :class:`UnavailableError` naming the endpoints. A retry may re-send a write whose
    first attempt was applied before the connection broke (or, by a stalled member, after
    the retry); writes guarded by a revision compare are safe (the replay fails its
    compare).

    Errors: compaction -> :class:`CompactedError` (with the compacted revision),
    future revision -> :class:`FutureRevisionError`, too many ops / too many bytes ->
    :class:`TxnTooLargeError`, duplicate key -> :class:`DuplicateKeyError`, unknown lease
    -> :class:`LeaseNotFoundError`, auth problems -> :class:`EtcdAuthError`, a call
    that timed out -> :class:`UnavailableError`; anything else -> :class:`KVError`.

    Auth: with ``username``/``password`` it logs in on first use and sends the token as
    the ``token`` metadata entry (this works on plaintext channels, unlike gRPC call
    credentials); when etcd says the token is invalid (it expires after 5 idle minutes
    by default) it logs in again once and retries.

    ``max_txn_ops`` and ``max_request_bytes`` advertise the server's limits to callers
    (who split work accordingly); they must match the server's ``--max-txn-ops`` and
    ``--max-request-bytes``. The server enforces them, not this client. Left out,
    ``max_txn_ops`` is learned from the server at first use (:meth:`_probe_txn_ops`),
    by reading ``probe_key``: a key the credentials may read (a role limited to a
    cell's prefix may read nothing else).

    TLS: ``ca_cert`` checks the server; ``cert_chain`` and ``private_key`` are this
    client's certificate, which an etcd started with ``--client-cert-auth`` requires
    and, with auth enabled, takes the common name of as the user name (no password
    then; a token from ``username``/``password`` takes precedence over it).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 10.0,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        username: str | None = None,
        password: str | None = None,
        ca_cert: bytes | None = None,
        cert_chain: bytes | None = None,
        private_key: bytes | None = None,
        max_txn_ops: int | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        probe_key: bytes = b"\x00omega-max-txn-ops-probe",
    ) -> None:
        if isinstance(endpoints, str):  # a lone "host:port" is a Sequence[str] too
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("EtcdKV needs at least one endpoint")
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        if (cert_chain is None) != (private_key is None):
            raise ValueError("give both cert_chain and private_key (client TLS), or neither")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        if not attempt_timeout > 0:
            raise ValueError(f"attempt_timeout must be positive, not {attempt_timeout!r}")
        parsed = [_strip_scheme(e) for e in endpoints]
        tls = ca_cert is not None or cert_chain is not None or any(t for _, t in parsed)
        credentials = (
            grpc.ssl_channel_credentials(
                root_certificates=ca_cert, private_key=private_key, certificate_chain=cert_chain
            )
            if tls
            else None
        )
        self._max_txn_ops = max_txn_ops
        self._probe_key = probe_key
        self.max_request_bytes = max_request_bytes
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self._endpoints = [_Endpoint(address, credentials) for address, _ in parsed]
        self._current = 0  # index of the endpoint in use; moved on UNAVAILABLE
        self._lock = threading.Lock()  # guards _current, _watchers, _closed
        self._username = username
        self._password = password
        self._auth_lock = threading.Lock()  # one login at a time
        # ("token", ...) metadata once logged in; replaced as a whole, never mutated.
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._login_needed = username is not None
        self._watchers: set[EtcdWatcher] = set()
        self._closed = False

    # Limits tried, largest first, when the server's --max-txn-ops is not given.
    _TXN_OPS_CANDIDATES = (1024, 512, 256, 128, 64, 32, 16, 8)

    @property
    def max_txn_ops(self) -> int:
        """The server's --max-txn-ops (ops per branch of one transaction)."""
        if self._max_txn_ops is None:
            self._max_txn_ops = self._probe_txn_ops()
        return self._max_txn_ops

    @max_txn_ops.setter
    def max_txn_ops(self, value: int) -> None:
        self._max_txn_ops = value

    def _probe_txn_ops(self) -> int:
        """The largest candidate limit the server accepts: a transaction of that many
        reads of one key is refused as too large exactly when the limit is lower
        (reads write nothing, so the probe changes nothing). A few round trips, once."""
        probe = self._probe_key
        for n in self._TXN_OPS_CANDIDATES:
            try:
                self.txn([], [Get(probe)] * n)
            except TxnTooLargeError:
                continue
            return n
        return DEFAULT_MAX_TXN_OPS

    # ------------------------------------------------------------------ plumbing

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints as ``host:port``, in failover order."""
        return tuple(e.address for e in self._endpoints)

    def _call(
        self,
        attempt: Callable[[_Endpoint, float, Any], T],
        *,
        login: bool = True,
        key: bytes = b"\x00",
        per_attempt: bool = True,
    ) -> T:
        """Run ``attempt(endpoint, timeout, metadata)`` with failover, re-login and error
        mapping. ``attempt`` raises ``grpc.RpcError`` for a failed call; ``key`` is one
        the caller may read (used to find the compacted revision for CompactedError).
        ``per_attempt``: the attempt's ``timeout`` is the per-attempt one (False for a
        call that sets its own, longer, deadline)."""
        if self._closed:
            raise KVError("EtcdKV is closed")
        if login and self._login_needed:
            self._login()
        n = len(self._endpoints)
        start = time.monotonic()
        deadline = start + self.timeout
        tried = 0  # attempts that failed with UNAVAILABLE or missed their own deadline
        missed = 0  # of those, attempts that missed their own deadline
        relogged = False
        last_error = ""
        while True:
            index = self._current
            endpoint = self._endpoints[index]
            remaining = deadline - time.monotonic()
            budget = remaining
            if per_attempt and n > 1:
                budget = min(remaining, self.attempt_timeout * 2 ** (missed // n))
            metadata = self._metadata if login else None
            try:
                return attempt(endpoint, max(budget, 0.001), metadata)
            except grpc.RpcError as err:
                code = err.code()
                stalled = code is _DEADLINE_EXCEEDED and budget < remaining
                if stalled:
                    missed += 1
                if code is _UNAVAILABLE or stalled:
                    tried += 1
                    last_error = f"{endpoint.address}: {err.details()}"
                    with self._lock:
                        if self._current == index:  # another thread may have moved on already
                            self._current = (index + 1) % n
                    if tried >= n:  # every endpoint failed once this round: back off
                        pause = min(_BACKOFF_FIRST * 2 ** (tried // n - 1), _BACKOFF_MAX)
                        if time.monotonic() + pause >= deadline:
                            raise UnavailableError(
                                f"no etcd endpoint answered within {self.timeout:g} s "
                                f"(endpoints: {', '.join(self.endpoints)}); last error: "
                                f"{last_error}{_handshake_hint(last_error)}"
                            ) from None
                        time.sleep(pause)
                    if n > 1:
                        log.info(
                            "etcd endpoint %s unavailable (%s); trying %s",
                            endpoint.address,
                            err.details(),
                            self._endpoints[self._current].address,
                        )
                    continue
                if (
                    login
                    and not relogged
                    and self._username is not None
                    and self._token_rejected(err)
                ):
                    relogged = True
                    self._login(stale=metadata)
                    continue
                raise self._map_error(err, endpoint, key) from None

    @staticmethod
    def _token_rejected(err: Any) -> bool:
        details = err.details() or ""
        return (
            err.code() is _UNAUTHENTICATED
            or _MSG_INVALID_TOKEN in details
            or _MSG_AUTH_OLD_REVISION in details
        )

    def _map_error(self, err: Any, endpoint: _Endpoint, key: bytes = b"\x00") -> KVError:
        """The :mod:`cellstate.kv.base` exception for a failed gRPC call."""
        code = err.code()
        details: str = err.details() or ""
        where = f"(etcd {endpoint.address})"
        if _MSG_COMPACTED in details:
            return CompactedError(self.compact_revision(key))
        if _MSG_FUTURE in details:
            return FutureRevisionError(f"{details} {where}")
        if (
            _MSG_TOO_MANY_OPS in details
            or _MSG_TOO_LARGE in details
            or (code is grpc.StatusCode.RESOURCE_EXHAUSTED and _MSG_GRPC_TOO_LARGE in details)
        ):
            return TxnTooLargeError(f"{details} {where}")
        if _MSG_DUPLICATE in details:
            return DuplicateKeyError(f"{details} {where}")
        if _MSG_LEASE_NOT_FOUND in details:
            return LeaseNotFoundError(f"{details} {where}")
        if _MSG_USER_EMPTY in details and self._username is None:
            return EtcdAuthError(
                f"etcd requires authentication; pass username= and password= to EtcdKV {where}"
            )
        if (
            code in (_UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
            or _MSG_AUTH_FAILED in details
            or _MSG_USER_EMPTY in details
            or _MSG_INVALID_TOKEN in details
            or _MSG_PERMISSION_DENIED in details  # admin calls say "auth: permission denied"
        ):
            who = f" as user {self._username!r}" if self._username else ""
            return EtcdAuthError(f"{details}{who} {where}")
        if _MSG_NO_SPACE in details:
            return EtcdNoSpaceError(
                f"etcd is out of space (NOSPACE alarm: --quota-backend-bytes reached); it "
                f"takes only reads and deletes until compacted, defragmented and disarmed "
                f"{where}"
            )
        if code is _DEADLINE_EXCEEDED:
            return UnavailableError(f"etcd call timed out after {self.timeout:g} s {where}")
        return KVError(f"etcd {code.name}: {details} {where}")

    def _login(self, stale: tuple[tuple[str, str], ...] | None = None) -> None:
        """Log in and install the token. With ``stale``, only if no other thread has
        replaced that token already."""
        with self._auth_lock:
            if not self._login_needed and self._metadata != stale:
                return
            request = pb.AuthenticateRequest(
                name=self._username or "", password=self._password or ""
            )
            try:
                response = self._call(
                    lambda ep, t, _md: ep.auth.Authenticate(request, timeout=t), login=False
                )
            except EtcdAuthError as err:
                raise EtcdAuthError(
                    f"etcd rejected the credentials of user {self._username!r}: {err}"
                ) from None
            except KVError as err:
                if _MSG_AUTH_NOT_ENABLED not in str(err):
                    raise
                # etcd's own client does the same: credentials for a server without auth
                # are not an error; requests simply carry no token.
                log.info("etcd auth is not enabled; ignoring the credentials")
                self._metadata = None
            else:
                self._metadata = (("token", response.token),)
            self._login_needed = False

    def compact_revision(self, key: bytes = b"\x00") -> int:
        """The store's compacted revision: reads below it raise :class:`CompactedError`
        (0 when nothing was compacted or it cannot be found out in time).

        Neither Range nor Status reports it, and etcd's "compacted" error does not say
        where history starts. But a watch from revision 1 is cancelled with
        ``compact_revision`` set to exactly that, and otherwise answers a progress
        request once it has caught up (etcd drops progress requests until then, so they
        are repeated). ``key`` is the key watched (one the credentials may read).
        """
        try:
            watcher = self.watch(key, start_revision=1, progress_notify=False)
        except KVError:
            return 0
        try:
            deadline = time.monotonic() + min(self.timeout, 5.0)
            while (remaining := deadline - time.monotonic()) > 0:
                resp = watcher.next(timeout=min(remaining, 0.1))
                if resp is None:
                    watcher.request_progress()
                elif resp.canceled:
                    return resp.compact_revision
                elif resp.is_progress:
                    return 0
            return 0
        except KVError:
            return 0
        finally:
            watcher.cancel()

    # ------------------------------------------------------------------- the KV

    def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        revision: int = 0,
        limit: int = 0,
        keys_only: bool = False,
    ) -> RangeResult:
        """Keys in ``[key, range_end)`` (just ``key`` when ``range_end`` is None), sorted by
        key, at ``revision`` (0: the newest), at most ``limit`` of them (0: all).
        ``RangeResult.revision`` is the revision the read was served at (etcd's header
        revision, i.e. the store's newest even for a read at a past revision), ``more``
        whether ``limit`` cut the result, ``count`` the number of keys in the range.
        With ``keys_only`` values are empty. Linearizable (served through the leader)."""
        request = pb.RangeRequest(key=key, limit=limit, revision=revision, keys_only=keys_only)
        if range_end is not None:
            request.range_end = range_end

        def attempt(ep: _Endpoint, timeout: float, metadata: Any) -> Any:
            return ep.kv.Range(request, timeout=timeout, metadata=metadata)

        response = self._call(attempt, key=key)
        return RangeResult(
            _kvs(response.kvs), response.header.revision, response.more, response.count
        )

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """One etcd transaction: if every compare holds run ``success`` else ``failure``.

        ``responses[i]`` answers op ``i`` of the branch that ran: :class:`Get` -> tuple of
        :class:`KeyValue`, :class:`Delete` -> number deleted, :class:`Put` -> None;
        ``revision`` is etcd's header revision (the new revision when something was
        written). Raises :class:`TxnTooLargeError` / :class:`DuplicateKeyError` when the
        server rejects the request (see the class docstring for the rest).
        """
        # Hot path (benchmarked): the request is built in place, field by field.
        request = pb.TxnRequest()
        if compares:
            _add_compares(request.compare, compares)
        success_only_puts = _add_ops(request.success, success)
        failure_only_puts = _add_ops(request.failure, failure) if failure else True

        def attempt(ep: _Endpoint, timeout: float, metadata: Any) -> Any:
            return ep.kv.Txn(request, timeout=timeout, metadata=metadata)

        response = self._call(attempt)
        if response.succeeded:
            branch, only_puts = success, success_only_puts
        else:
            branch, only_puts = failure, failure_only_puts
        revision = response.header.revision
        results = (
            (None,) * len(branch) if only_puts
            else _op_results(branch, response.responses, revision)
        )
        return TxnResult(response.succeeded, revision, results)

    def compact(self, revision: int, *, physical: bool = False,
                timeout: float | None = None) -> None:
        """Compact history before ``revision``. By default logical: etcd frees the space
        in the background; with ``physical`` the call returns once the compacted
        entries are gone from the backend (so a defragmentation right after returns
        their space), which for a large history takes longer than a call's usual
        ``timeout``. Compacting at or below the current compacted revision raises
        :class:`CompactedError`, above the store revision :class:`FutureRevisionError`."""
        request = pb.CompactionRequest(revision=revision, physical=physical)
        self._call(lambda ep, t, md: ep.kv.Compact(
            request, timeout=t if timeout is None else timeout, metadata=md),
            per_attempt=False)

    def watch(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        start_revision: int = 0,
        progress_notify: bool = True,
    ) -> EtcdWatcher:
        """Watch ``[key, range_end)`` from ``start_revision`` (inclusive; 0: from now).

        Returns once etcd has confirmed the watch (its "created" response), so every
        change after this call returns is delivered. With ``progress_notify`` (the
        default) an idle watch receives event-less responses at the server's
        ``--experimental-watch-progress-notify-interval``. Creating fails over between
        endpoints like any call; an established watch does not (it raises
        :class:`WatchDroppedError` and the caller re-watches from
        :attr:`EtcdWatcher.resume_revision`).
        """
        create = pb.WatchCreateRequest(
            key=key, start_revision=start_revision, progress_notify=progress_notify
        )
        if range_end is not None:
            create.range_end = range_end

        def attempt(ep: _Endpoint, timeout: float, metadata: Any) -> EtcdWatcher:
            watcher = EtcdWatcher(ep, create, metadata, self._forget_watcher)
            try:
                watcher._wait_created(timeout)
            except BaseException:
                watcher.cancel()
                raise
            return watcher

        # A watch waits for its confirmation the whole call's timeout (it raises
        # UnavailableError itself, so a stalled member is not skipped here).
        try:
            watcher = self._call(attempt, key=key, per_attempt=False)
        except EtcdAuthError:
            # etcd 3.5 reports an expired token on a watch as "permission denied" on the
            # create response, indistinguishable from a real denial: log in once more.
            if self._username is None:
                raise
            self._login(stale=self._metadata)
            watcher = self._call(attempt, key=key, per_attempt=False)
        with self._lock:
            if self._closed:
                watcher.cancel()
                raise KVError("EtcdKV is closed")
            self._watchers.add(watcher)
        return watcher

    def _forget_watcher(self, watcher: EtcdWatcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def lease_grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its ID."""
        request = pb.LeaseGrantRequest(TTL=ttl)
        response = self._call(
            lambda ep, t, md: ep.lease.LeaseGrant(request, timeout=t, metadata=md)
        )
        if response.error:
            raise KVError(f"etcd refused the lease: {response.error}")
        return int(response.ID)

    def lease_keepalive(self, lease_id: int) -> int:
        """Refresh the lease once; returns its TTL in seconds. Raises
        :class:`LeaseNotFoundError` when it has expired or was revoked."""
        request = pb.LeaseKeepAliveRequest(ID=lease_id)

        def attempt(ep: _Endpoint, timeout: float, metadata: Any) -> Any:
            # LeaseKeepAlive is a stream; one request, one answer. The server answers
            # before it sees the end of our request stream.
            call = ep.lease.LeaseKeepAlive(iter((request,)), timeout=timeout, metadata=metadata)
            try:
                return next(call)
            except StopIteration:
                raise KVError("etcd closed the keep-alive stream without answering") from None
            finally:
                call.cancel()

        response = self._call(attempt)
        if response.TTL <= 0:
            raise LeaseNotFoundError(f"lease {lease_id:x} has expired or was revoked")
        return int(response.TTL)

    def lease_keys(self, lease_id: int) -> tuple[bytes, ...]:
        """The keys attached to the lease, sorted. Raises :class:`LeaseNotFoundError`
        when it has expired or was revoked (etcd answers TTL -1 then)."""
        request = pb.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        response = self._call(
            lambda ep, t, md: ep.lease.LeaseTimeToLive(request, timeout=t, metadata=md))
        if response.TTL < 0:
            raise LeaseNotFoundError(f"lease {lease_id:x} has expired or was revoked")
        return tuple(sorted(response.keys))

    def lease_revoke(self, lease_id: int) -> None:
        """Revoke the lease, deleting its keys in one revision. Raises
        :class:`LeaseNotFoundError` for an unknown lease."""
        request = pb.LeaseRevokeRequest(ID=lease_id)
        self._call(lambda ep, t, md: ep.lease.LeaseRevoke(request, timeout=t, metadata=md))

    def status(self) -> pb.StatusResponse:
        """Maintenance.Status of the endpoint in use (server version, leader, db size)."""
        request = pb.StatusRequest()
        response: pb.StatusResponse = self._call(
            lambda ep, t, md: ep.maintenance.Status(request, timeout=t, metadata=md)
        )
        return response

    # -------------------------------------------------------------- maintenance

    def _call_at(self, address: str, attempt: Callable[[_Endpoint, float, Any], T],
                 timeout: float) -> T:
        """Run ``attempt`` on the member at ``address`` only (no failover: maintenance
        is about that member), logging in again once on a rejected token."""
        for endpoint in self._endpoints:
            if endpoint.address == _strip_scheme(address)[0]:
                break
        else:
            raise ValueError(f"{address!r} is not one of this client's endpoints "
                             f"({', '.join(self.endpoints)})")
        if self._closed:
            raise KVError("EtcdKV is closed")
        if self._login_needed:
            self._login()
        metadata = self._metadata
        try:
            return attempt(endpoint, timeout, metadata)
        except grpc.RpcError as err:
            if self._username is not None and self._token_rejected(err):
                self._login(stale=metadata)
                try:
                    return attempt(endpoint, timeout, self._metadata)
                except grpc.RpcError as again:
                    err = again
            if err.code() in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
                raise UnavailableError(
                    f"etcd member {endpoint.address} did not answer: {_describe(err)}"
                ) from None
            raise self._map_error(err, endpoint) from None

    def member_status(self, endpoint: str, timeout: float | None = None) -> MemberStatus:
        """Maintenance.Status of the member at ``endpoint`` (one of :attr:`endpoints`),
        asked of that member alone. Raises :class:`UnavailableError` when it does not
        answer within ``timeout`` (default: the client's)."""
        request = pb.StatusRequest()
        r: pb.StatusResponse = self._call_at(
            endpoint,
            lambda ep, t, md: ep.maintenance.Status(request, timeout=t, metadata=md),
            timeout or self.timeout,
        )
        return MemberStatus(
            endpoint=_strip_scheme(endpoint)[0], member_id=r.header.member_id,
            leader=r.leader, db_size=r.dbSize, db_size_in_use=r.dbSizeInUse,
            revision=r.header.revision, raft_term=r.raftTerm, version=r.version,
            errors=tuple(r.errors),
        )

    def defragment(self, endpoint: str, timeout: float = 600.0) -> None:
        """Defragment the member at ``endpoint``: rewrite its backend file without free
        pages. The member serves nothing meanwhile (seconds per GiB), so do one member
        at a time. With etcd auth on, this needs the root role."""
        request = pb.DefragmentRequest()
        self._call_at(
            endpoint,
            lambda ep, t, md: ep.maintenance.Defragment(request, timeout=t, metadata=md),
            timeout,
        )

    def alarms(self) -> tuple[EtcdAlarm, ...]:
        """Every raised alarm of the cluster (with failover between endpoints)."""
        request = pb.AlarmRequest(action=pb.AlarmRequest.GET, memberID=0, alarm=pb.NONE)
        response = self._call(
            lambda ep, t, md: ep.maintenance.Alarm(request, timeout=t, metadata=md)
        )
        return tuple(
            EtcdAlarm(a.memberID, pb.AlarmType.Name(a.alarm)) for a in response.alarms
        )

    def disarm(self, alarm: EtcdAlarm) -> None:
        """Deactivate ``alarm`` (etcd then takes writes again, until the condition raises
        it anew). With etcd auth on, this needs the root role."""
        request = pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=alarm.member_id,
                                  alarm=alarm.kind)
        self._call(lambda ep, t, md: ep.maintenance.Alarm(request, timeout=t, metadata=md))

    # ------------------------------------------------------- auth administration
    # What setting up etcd's role-based access takes (cellstate/etcd_auth.py); once
    # auth is on, these need the root role.

    def user_add(self, name: str, password: str | None) -> bool:
        """Add an etcd user; ``password`` None: none, the user authenticates by client
        certificate (its common name) only. False when the user exists already (it is
        left as it is)."""
        options = auth_pb2.UserAddOptions(no_password=password is None)
        request = pb.AuthUserAddRequest(name=name, password=password or "", options=options)
        return self._created(
            lambda ep, t, md: ep.auth.UserAdd(request, timeout=t, metadata=md),
            _MSG_USER_EXISTS)

    def role_add(self, name: str) -> bool:
        """Add an etcd role; False when it exists already."""
        request = pb.AuthRoleAddRequest(name=name)
        return self._created(
            lambda ep, t, md: ep.auth.RoleAdd(request, timeout=t, metadata=md),
            _MSG_ROLE_EXISTS)

    def role_grant_permission(self, role: str, key: bytes, range_end: bytes | None,
                              *, write: bool) -> None:
        """Let ``role`` read (and with ``write`` also write) ``[key, range_end)``
        (just ``key`` when ``range_end`` is None). Granting it again changes nothing."""
        kind = auth_pb2.Permission.READWRITE if write else auth_pb2.Permission.READ
        perm = auth_pb2.Permission(permType=kind, key=key, range_end=range_end or b"")
        request = pb.AuthRoleGrantPermissionRequest(name=role, perm=perm)
        self._call(lambda ep, t, md: ep.auth.RoleGrantPermission(request, timeout=t,
                                                                 metadata=md))

    def user_grant_role(self, user: str, role: str) -> None:
        """Give ``user`` the role; granting it again changes nothing."""
        request = pb.AuthUserGrantRoleRequest(user=user, role=role)
        self._call(lambda ep, t, md: ep.auth.UserGrantRole(request, timeout=t, metadata=md))

    def auth_enable(self) -> None:
        """Turn authentication on (etcd needs a root user with the root role first);
        already on: nothing happens."""
        request = pb.AuthEnableRequest()
        self._call(lambda ep, t, md: ep.auth.AuthEnable(request, timeout=t, metadata=md))

    def _created(self, attempt: Callable[[_Endpoint, float, Any], Any], exists: str) -> bool:
        try:
            self._call(attempt)
        except KVError as err:
            if exists in str(err):
                return False
            raise
        return True

    def close(self) -> None:
        """Cancel every open watcher and close the channels. Idempotent; later calls
        raise :class:`KVError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watchers = list(self._watchers)
            self._watchers.clear()
        for watcher in watchers:
            watcher.cancel()
        for endpoint in self._endpoints:
            endpoint.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EtcdKV({list(self.endpoints)!r})"


class _Dropped:
    """Queue marker: the stream ended; ``error`` says why."""

    __slots__ = ("error",)

    def __init__(self, error: KVError) -> None:
        self.error = error


_END_OF_REQUESTS: Final = None


class EtcdWatcher:
    """One etcd watch on its own bidi stream (the :class:`cellstate.kv.base.Watcher`
    protocol). Made by :meth:`EtcdKV.watch`.

    A daemon thread reads the stream into a queue; :meth:`next` takes from it:

    * events as one :class:`WatchResponse` per revision, in order, with ``revision`` =
      that revision (etcd may pack several revisions into one message; they are split),
      deletes with ``value=b""`` and ``mod_revision`` = the delete's revision;
    * progress notifications (periodic, or answering :meth:`request_progress`) as
      responses with no events;
    * a cancel because ``start_revision`` is compacted as a response with
      ``canceled=True`` and ``compact_revision`` set; it is the last one, after it
      :meth:`next` returns None at once;
    * a broken stream (server gone, UNAVAILABLE, cancelled by the server for another
      reason) as :class:`WatchDroppedError`, raised by :meth:`next` once everything
      received before has been returned, and again on every later call.

    etcd's initial "created" response is consumed, not delivered. After a drop, resume
    from :attr:`resume_revision` (the last delivered ``revision`` + 1).

    :meth:`next` is meant for one consumer thread; :meth:`request_progress` and
    :meth:`cancel` may be called from any thread.
    """

    def __init__(
        self,
        endpoint: _Endpoint,
        create: pb.WatchCreateRequest,
        metadata: Any,
        on_close: Callable[[EtcdWatcher], None] | None = None,
    ) -> None:
        self.endpoint = endpoint.address
        self.key = create.key
        self.range_end = create.range_end or None
        self.start_revision = create.start_revision
        self._resume = create.start_revision  # see resume_revision
        self._on_close = on_close
        self._requests: queue.SimpleQueue[pb.WatchRequest | None] = queue.SimpleQueue()
        # None wakes a next() blocked while cancel() runs in another thread.
        self._responses: queue.SimpleQueue[WatchResponse | _Dropped | None] = queue.SimpleQueue()
        self._created = threading.Event()
        self._create_error: BaseException | None = None
        self._cancelled = False
        self._finished = False  # a cancel response or a drop was returned by next()
        self._drop: KVError | None = None
        self._lock = threading.Lock()
        self._requests.put(pb.WatchRequest(create_request=create))
        # No deadline: the stream lives until cancel() or the server goes away.
        self._call: Any = endpoint.watch.Watch(self._request_stream(), metadata=metadata)
        self._thread = threading.Thread(
            target=self._read, name=f"etcd-watch {create.key!r}@{endpoint.address}", daemon=True
        )
        self._thread.start()

    @property
    def resume_revision(self) -> int:
        """Where a new watch should start to continue this one without gaps or repeats:
        the last delivered event's revision + 1, or a progress notification's revision
        + 1, or ``start_revision`` when nothing came yet (0 meaning "from now")."""
        return self._resume

    def _request_stream(self) -> Iterator[pb.WatchRequest]:
        # gRPC pulls from this in its own thread; None ends our half of the stream.
        while (request := self._requests.get()) is not _END_OF_REQUESTS:
            yield request

    def _read(self) -> None:
        """The reader thread: stream -> queue, until the stream ends."""
        try:
            for resp in self._call:
                if not self._handle(resp):
                    return
            self._dropped("etcd closed the watch stream")
        except grpc.RpcError as err:
            if self._cancelled:
                return
            if not self._created.is_set():
                self._create_error = err  # watch() maps it (failover, re-login)
            else:
                self._dropped(f"watch stream lost: {_describe(err)}")
        except BaseException as err:  # a bug here must not leave next() blocked forever
            self._dropped(f"watch reader failed: {err!r}")
            raise
        finally:
            if not self._created.is_set() and self._create_error is None:
                self._create_error = UnavailableError(
                    f"the watch stream on {self.key!r} ended before etcd confirmed the watch "
                    f"({self.endpoint})"
                )
            self._created.set()
            self._requests.put(_END_OF_REQUESTS)  # ends our half of the stream
            if not self._cancelled and self._on_close is not None:
                self._on_close(self)  # dead either way; the owner need not track it

    def _handle(self, resp: pb.WatchResponse) -> bool:
        """Queue one response; False when it was the last one of this watch."""
        if resp.created and not self._created.is_set():
            if resp.canceled and not resp.compact_revision:
                # Refused at creation (etcd 3.5 reports an invalid token as
                # "permission denied" here).
                reason = resp.cancel_reason or "no reason given"
                message = f"etcd refused the watch on {self.key!r}: {reason} ({self.endpoint})"
                denied = _MSG_PERMISSION_DENIED in reason
                self._create_error = EtcdAuthError(message) if denied else KVError(message)
                return False
            self._created.set()
            if not resp.canceled:
                return True  # the "created" response is not delivered
        if resp.canceled:
            if resp.compact_revision:
                self._responses.put(
                    WatchResponse(resp.header.revision, (), resp.compact_revision, True)
                )
            else:
                self._dropped(f"etcd cancelled the watch: {resp.cancel_reason or 'no reason'}")
            return False
        events = resp.events
        if not events:  # a progress notification: the header revision is caught up to
            self._responses.put(WatchResponse(resp.header.revision))
        elif events[0].kv.mod_revision == events[-1].kv.mod_revision:  # the usual case
            self._responses.put(WatchResponse(events[0].kv.mod_revision, _events(events)))
        else:
            # Catching up on history, etcd packs many revisions into one response and
            # stamps it with the store's newest revision although more history may
            # follow. Deliver one response per revision, stamped with that revision, as
            # MemoryKV does: `revision` then always means "seen up to here".
            converted = _events(events)
            start = 0
            for i in range(1, len(converted) + 1):
                if (
                    i == len(converted)
                    or converted[i].kv.mod_revision != converted[start].kv.mod_revision
                ):
                    rev = converted[start].kv.mod_revision
                    self._responses.put(WatchResponse(rev, converted[start:i]))
                    start = i
        return True

    def _dropped(self, why: str) -> None:
        if not self._cancelled:
            message = f"{why} (watch on {self.key!r}, etcd {self.endpoint})"
            self._responses.put(_Dropped(WatchDroppedError(message)))

    def _wait_created(self, timeout: float) -> None:
        """Block until etcd confirmed the watch; re-raise what prevented it."""
        if not self._created.wait(timeout):
            raise UnavailableError(
                f"etcd did not confirm the watch within {timeout:.1f} s (etcd {self.endpoint})"
            )
        if self._create_error is not None:
            raise self._create_error

    def next(self, timeout: float | None = None) -> WatchResponse | None:
        """The next response, or None when ``timeout`` seconds pass first (None: wait as
        long as it takes). Returns None at once after :meth:`cancel` or after the
        compaction cancel was returned. Raises :class:`WatchDroppedError` when the
        stream is lost."""
        if self._drop is not None:
            raise self._drop
        if self._cancelled:
            return None
        try:
            if self._finished:
                item = self._responses.get_nowait()
            else:
                item = self._responses.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:  # cancelled meanwhile
            return None
        if type(item) is _Dropped:
            self._drop = item.error
            raise item.error
        assert isinstance(item, WatchResponse)
        if item.events:
            self._resume = item.events[-1].kv.mod_revision + 1
        elif item.canceled:
            self._finished = True
        else:  # a progress notification: the watch has seen everything up to here
            self._resume = max(self._resume, item.revision + 1)
        return item

    def request_progress(self) -> None:
        """Ask etcd for a progress notification (answered as a response with no events
        once the watch has caught up). No-op on a cancelled or broken stream."""
        if not self._cancelled and self._thread.is_alive():
            self._requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def cancel(self) -> None:
        """End the stream and wait for the reader thread. Idempotent."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
        self._requests.put(_END_OF_REQUESTS)
        self._responses.put(None)
        self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        if self._on_close is not None:
            self._on_close(self)

    @property
    def alive(self) -> bool:
        """Whether the stream is still open (not cancelled, not broken)."""
        return not self._cancelled and self._thread.is_alive()

    def __enter__(self) -> EtcdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __repr__(self) -> str:
        return f"EtcdWatcher(key={self.key!r}, endpoint={self.endpoint!r}, resume={self._resume})"
