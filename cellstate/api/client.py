"""Talking to the cellstate service: for schedulers, agents and the CLI.

* :class:`CellClient`: every RPC, over several endpoints. Every attempt has a deadline
  (``timeout``, 5 s by default, more for large commits and registrations; keep-alives
  a fraction of their lease's ttl). A call that finds its server unavailable, or that
  gets no answer before its deadline (a hung, paused or unreachable server answers
  nothing at all), moves to the next endpoint and retries, with backoff once every
  endpoint has failed, until its retry budget is spent; then it raises
  :class:`ServiceUnavailable`. Other failures come back as the store's exceptions
  (``NotFoundError``, ``AlreadyExistsError``, ``TransactionError``...) with the
  server's message, so code written against a direct
  :class:`~cellstate.store.CellStore` handles them unchanged.
* :class:`SyncFeed`: a :class:`~cellstate.replica.Feed` over the sync stream, so a
  ``Replica(SyncFeed(client))`` is a synced local copy with the same interface as one
  that reads etcd directly. A dropped stream, or one silent for longer than
  ``stream_idle_timeout`` (a live server sends progress every second), resumes from
  the last revision + 1 on the next endpoint.
* :class:`RemoteStore`: what a scheduler instance commits through.
* :class:`RemoteAgentBackend`: what a node agent reports through.

A request retried after a deadline may have been applied by the server that did not
answer (it may only be slow, or paused). The store's guards make every retry safe: a
commit's claims then come back as ``task_already_placed`` (the scheduler resyncs and
sees the placement: nothing is placed twice), a resent job submission that finds its
own job is taken as done, a resent report is dropped as moot, and a resent
registration gets a new lease while the old one lapses.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import orjson

from cellstate import codec
from cellstate.api import convert
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.tls import TlsFiles, channel_credentials
from cellstate.errors import (
    AccessDenied as AccessDenied,
    AlreadyExistsError,
    ClientError as ClientError,
    ContentionError,
    KVError,
    LeaseNotFoundError,
    NotFoundError,
    ServiceUnavailable as ServiceUnavailable,
    StoreError,
    TransactionError,
    WatchDroppedError,
)
from cellstate.kv.base import (
    EventType,
    KeyValue,
    RangeResult,
    WatchEvent,
    WatchResponse,
)
from cellstate.model import (
    CommitResult,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    TaskResult,
    TaskState,
    Transaction,
)
from cellstate.replica import Replica

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024 * 1024  # a snapshot of a large cell arrives in several messages


class ResentAlreadyExists(AlreadyExistsError):
    """ALREADY_EXISTS for a request that was sent more than once: what exists may be
    what an earlier attempt of the same request wrote."""


def _raise_for(e: grpc.RpcError, what: str, invalid: type[Exception] = ClientError,
               resent: bool = False) -> None:
    code = e.code()
    msg = f"{what}: {e.details()}"
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        raise invalid(msg) from None
    if code is grpc.StatusCode.NOT_FOUND:
        raise NotFoundError(msg) from None
    if code is grpc.StatusCode.ALREADY_EXISTS:
        raise (ResentAlreadyExists if resent else AlreadyExistsError)(msg) from None
    if code is grpc.StatusCode.ABORTED:
        raise ContentionError(msg) from None
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        raise AccessDenied(msg) from None
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED):
        raise StoreError(msg) from None
    raise ServiceUnavailable(msg) from None


# DEADLINE_EXCEEDED: the server did not answer in time. It may be hung, paused or cut
# off by the network, and then only another endpoint will answer.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Server time per claim or machine a large request may need on top of ``timeout``
# (a claim costs well under a millisecond; docs/performance.md).
PER_ITEM_TIMEOUT = 0.002
# Machines per RegisterAgent call (the server takes up to 1,000): a piece is written in
# well under a second on a quiet host, a few on a loaded one, far within a lease.
REGISTER_PIECE = 500
# Reconnect quickly: a restarted server (or the next replica) should be found within a
# second, not after gRPC's default backoff (1 s, growing 1.6-fold to two minutes).
FAST_RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100),
                  ("grpc.min_reconnect_backoff_ms", 100),
                  ("grpc.max_reconnect_backoff_ms", 1000))
MIN_ATTEMPT = 0.1  # no attempt gets a shorter deadline, however little budget is left


def keep_alive_deadlines(ttl: float) -> tuple[float, float]:
    """(deadline of one attempt, budget for all attempts) of a keep-alive for a lease
    of ``ttl`` seconds: a hung server costs a sixth of the ttl before the next endpoint
    is tried, and the whole renewal gives up after half the ttl, leaving time to try
    again before the lease lapses."""
    return min(max(ttl / 6, 0.2), 2.0), ttl / 2


class CellClient:
    """The service's API over ``endpoints`` (see the module docstring).

    ``timeout``: the deadline of one attempt (large commits and registrations get
    more); ``retry_for``: how long a call keeps trying other endpoints;
    ``stream_idle_timeout``: a sync stream that sends nothing (not even progress) for
    this long is taken for dead and resumed elsewhere (a live server sends a heartbeat
    every second, so four silent seconds mean it is hung); ``tls``: this process's
    certificate, key and the cell's CA, for mutual TLS (None: plaintext, which a TLS
    server refuses)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        retry_for: float = 30.0,
        stream_idle_timeout: float = 4.0,
        sleep: Callable[[float], None] = time.sleep,
        tls: TlsFiles | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("no cellstate endpoints given")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self.retry_for = retry_for
        self.stream_idle_timeout = stream_idle_timeout
        self._sleep = sleep
        opts = [("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE), *FAST_RECONNECT]
        self.tls = tls
        self._channels = [_channel(e, tls, opts) for e in self.endpoints]
        self._stubs = [pb_grpc.CellStateStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        self._current = 0
        self._lock = threading.Lock()
        self._seen = 0  # the newest revision any reply showed this client

    @property
    def seen_revision(self) -> int:
        """The newest revision a reply has shown this client. Status reads ask for a
        copy of the cell at least this new, so they see this client's own writes and
        never go back in time, whichever server answers."""
        return self._seen

    def saw(self, revision: int) -> None:
        with self._lock:
            if revision > self._seen:
                self._seen = revision

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> CellClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._current]

    def _next_endpoint(self, failed: int) -> None:
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self._stubs)

    def call(self, method: str, request: Any, *, what: str = "",
             invalid: type[Exception] = ClientError, timeout: float | None = None,
             retry_for: float | None = None) -> Any:
        """Call ``method``, each attempt with a deadline of ``timeout`` seconds (default
        the client's), moving to the next endpoint while they are unavailable or do not
        answer in time, for ``retry_for`` seconds (default the client's budget)."""
        attempt = timeout or self.timeout
        deadline = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        delay = 0.05
        failed = 0  # attempts in a row that failed
        while True:
            index = self._current
            left = deadline - time.monotonic()
            try:
                reply = getattr(self._stubs[index], method)(
                    request, timeout=max(min(attempt, left), MIN_ATTEMPT), wait_for_ready=False)
            except grpc.RpcError as e:
                code = e.code()
                if code not in _RETRYABLE or time.monotonic() >= deadline:
                    _raise_for(e, what or method, invalid, resent=failed > 0)
                # A missed deadline is news (a server hangs); a refusal is routine.
                log.log(logging.INFO if code is grpc.StatusCode.DEADLINE_EXCEEDED
                        else logging.DEBUG, "%s at %s failed (%s: %s); trying the next "
                        "endpoint", method, self.endpoints[index], code.name, e.details())
                self._next_endpoint(index)
                failed += 1
                # A server that did not answer in time cost us its deadline already: go
                # to the next one at once. Back off once every endpoint has failed.
                if code is grpc.StatusCode.UNAVAILABLE or failed % len(self._stubs) == 0:
                    self._sleep(min(delay * random.uniform(0.5, 1.0),
                                    max(deadline - time.monotonic(), 0.0)))
                    delay = min(delay * 2, 1.0)
                continue
            # Writes' replies and list replies carry the revision they were made at.
            revision = getattr(reply, "revision", 0)
            if revision > self._seen:
                self.saw(revision)
            return reply

    def stream(self, request: pb.SyncRequest) -> tuple[str, Any]:
        """Open a sync stream on the current endpoint: (endpoint, response iterator)."""
        index = self._current
        return self.endpoints[index], self._stubs[index].Sync(request)

    def stream_failed(self, endpoint: str) -> None:
        if endpoint in self.endpoints:
            self._next_endpoint(self.endpoints.index(endpoint))

    # -- the API, in model terms -------------------------------------------------------

    def commit(self, txn: Transaction, instance: str = "") -> CommitResult:
        request = pb.CommitRequest(transaction=convert.transaction_to(txn, instance))
        reply = self.call("Commit", request, what="commit", invalid=TransactionError,
                          timeout=self.timeout + PER_ITEM_TIMEOUT * len(txn.claims))
        return convert.result_from(txn, reply)  # call() saw its revision

    def commit_many(self, txns: Sequence[Transaction], instance: str = "") -> list[CommitResult]:
        """Several transactions in one Commit call, answered one by one (see
        ``CellStore.commit_many``)."""
        request = pb.CommitRequest(
            transactions=[convert.transaction_to(t, instance) for t in txns])
        reply = self.call("Commit", request, what="commit", invalid=TransactionError)
        results = convert.results_from(txns, reply)
        # The revisions are per transaction here, not on the reply call() looks at.
        self.saw(max((r.revision for r in results), default=0))
        return results

    def submit_job(self, job: Job | dict[str, Any], allow_unknown_scheduler: bool = False,
                   ) -> int:
        """Submit a job; ``allow_unknown_scheduler``: accept it for a scheduler that has
        not run in the cell yet (about to be started)."""
        doc = codec.job_to_doc(job) if isinstance(job, Job) else job
        try:
            reply = self.call("SubmitJob", pb.SubmitJobRequest(
                spec_json=orjson.dumps(doc), allow_unknown_scheduler=allow_unknown_scheduler),
                what="submitting a job")
        except ResentAlreadyExists:
            # An attempt that timed out may have been applied: if the job there is this
            # one, the submission succeeded.
            revision = self._own_job_revision(doc)
            if revision is None:
                raise
            return revision
        return int(reply.revision)

    def _own_job_revision(self, doc: dict[str, Any]) -> int | None:
        try:
            stored = self.get_job(str(doc.get("id", "")))
            mine = codec.job_to_doc(codec.parse_job(doc, "job"))
        except (StoreError, ValueError):
            return None
        theirs = dict(stored["spec"])
        for stamped in ("submitted_at", "owner"):  # the server fills them in if missing
            if stamped not in doc:
                theirs.pop(stamped, None)
                mine.pop(stamped, None)
        return int(stored["revision"]) if theirs == mine else None

    def get_job(self, job: str) -> dict[str, Any]:
        return job_info_doc(self.call("GetJob", pb.GetJobRequest(
            job=job, min_revision=self._seen), what=f"job {job}"))

    def list_jobs(self, scheduler: str = "", state: str = "", limit: int = 0,
                  newest_first: bool = False) -> list[dict[str, Any]]:
        reply = self.call("ListJobs", pb.ListJobsRequest(
            scheduler=scheduler, state=state, limit=limit, newest_first=newest_first,
            min_revision=self._seen),
                          what="listing jobs")
        return [job_info_doc(j) for j in reply.jobs]

    def kill_job(self, job: str, reason: str = "", by: str = "") -> int:
        reply = self.call("KillJob", pb.KillJobRequest(job=job, reason=reason, by=by),
                          what=f"killing job {job}")
        return int(reply.revision)

    def resize(self, job: str, task_count: int) -> int:
        reply = self.call("ResizeJob", pb.ResizeJobRequest(job=job, task_count=task_count),
                          what=f"resizing job {job}")
        return int(reply.revision)

    def set_machine_state(self, machine: str, action: str) -> dict[str, Any]:
        """Cordon, uncordon or drain (operators only): the revision (0 if nothing had to
        change), the machine's state and the tasks a drain lost."""
        reply = self.call("SetMachineState", pb.SetMachineStateRequest(
            machine=machine, action=action), what=f"{action} machine {machine}")
        return {"machine": machine, "revision": int(reply.revision), "state": reply.state,
                "tasks_lost": int(reply.tasks_lost)}

    def set_limits(self, scheduler: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change one scheduler's limits (operators only): ``changes`` has
        ``max_precedence`` and/or ``max_resources`` (None removes that limit). Returns
        the revision (0 if nothing had to change) and the scheduler's limits now."""
        reply = self.call("SetLimits", pb.SetLimitsRequest(
            scheduler=scheduler, changes_json=orjson.dumps(changes)),
            what=f"setting scheduler {scheduler}'s limits")
        return {"scheduler": scheduler, "revision": int(reply.revision),
                **orjson.loads(reply.limits_json)}

    def list_machines(self, state: str = "", limit: int = 0) -> list[dict[str, Any]]:
        reply = self.call("ListMachines", pb.ListMachinesRequest(
            state=state, limit=limit, min_revision=self._seen),
                          what="listing machines")
        return [{**orjson.loads(m.machine_json), "used": dict(m.used), "tasks": m.tasks,
                 "seq": m.seq} for m in reply.machines]

    def status(self) -> dict[str, Any]:
        s = self.call("GetStatus", pb.GetStatusRequest(min_revision=self._seen),
                      what="cell status")
        return {
            "server": s.server, "revision": s.revision, "machines_up": s.machines_up,
            "machines_down": s.machines_down, "capacity": dict(s.capacity),
            "used": dict(s.used), "jobs": dict(s.jobs), "tasks": dict(s.tasks),
            "agents": s.agents,
            "schedulers": [{"scheduler": x.scheduler, "instance": x.instance,
                            **orjson.loads(x.metrics_json)} for x in s.schedulers],
            "etcd": orjson.loads(s.etcd_json) if s.etcd_json else None,
            "limits": orjson.loads(s.limits_json) if s.limits_json else {},
        }

    def keep_alive(self, lease: int, ttl: float = 10.0) -> int:
        """Renew a lease of ``ttl`` seconds; returns its ttl, 0 if it is gone. Each
        attempt gets a fraction of the ttl and every endpoint is tried in turn
        (:func:`keep_alive_deadlines`), so a hung server cannot let the lease lapse;
        raises ServiceUnavailable after half the ttl (the caller tries again soon)."""
        attempt, budget = keep_alive_deadlines(ttl)
        return int(self.call("KeepAlive", pb.KeepAliveRequest(lease=lease), what="keep-alive",
                             timeout=attempt, retry_for=budget).ttl)


def _channel(endpoint: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = (),
             ) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(endpoint, options=options)
    return grpc.secure_channel(endpoint, channel_credentials(tls), options=options)


def _task_doc(t: pb.TaskInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {"index": t.index, "state": t.state, "machine": t.machine}
    if t.has_exit_code:
        doc["exit_code"] = t.exit_code
    if t.started_at:
        doc["started_at"] = t.started_at
    if t.ended_at:
        doc["ended_at"] = t.ended_at
    if t.detail:
        doc["detail"] = t.detail
    if t.placed_at:
        doc["placed_at"] = t.placed_at
    if t.scheduler:
        doc["scheduler"] = t.scheduler
    return doc


def job_info_doc(info: pb.JobInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {"spec": orjson.loads(info.spec_json), "state": info.state,
                           "task_states": dict(info.task_states), "revision": info.revision}
    if info.reason:
        doc["reason"] = info.reason
    if info.tasks:
        doc["tasks"] = [_task_doc(t) for t in info.tasks]
    if info.why_json:
        doc["why"] = orjson.loads(info.why_json)
    return doc


# -- the synced local copy -----------------------------------------------------------


class _Reset(Exception):
    def __init__(self, result: RangeResult) -> None:
        self.result = result


class _Watchdog:
    """Cancels a stream that stays silent for ``idle`` seconds (while a snapshot loads:
    a hung server would otherwise keep the reader waiting for ever)."""

    def __init__(self, stream: Any, idle: float) -> None:
        self._stream = stream
        self._idle = idle
        self._last = time.monotonic()
        self._done = threading.Event()
        self.fired = False
        threading.Thread(target=self._run, name="sync-watchdog", daemon=True).start()

    def touch(self) -> None:
        self._last = time.monotonic()

    def done(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.wait(min(self._idle / 4, 0.5)):
            if time.monotonic() - self._last > self._idle:
                self.fired = True
                self._stream.cancel()
                return


class SyncWatcher:
    """The rest of a sync stream as a :class:`~cellstate.kv.base.Watcher`; a thread
    reads the stream into a queue so that :meth:`next` can time out. A stream silent
    for longer than the client's ``stream_idle_timeout`` counts as dropped: the server
    sends progress every second when it is current, so silence means it is hung,
    paused, cut off, or itself no longer follows etcd."""

    def __init__(self, feed: SyncFeed, endpoint: str, stream: Any, root: bytes) -> None:
        self._feed = feed
        self._endpoint = endpoint
        self._stream = stream
        self._root = root
        self._queue: queue.SimpleQueue[WatchResponse | Exception | None] = queue.SimpleQueue()
        self._dropped: Exception | None = None
        self._cancelled = False
        self._heard_at = time.monotonic()
        self._thread = threading.Thread(target=self._read, name="sync-stream", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            snapshot: list[KeyValue] = []
            for msg in self._stream:
                self._heard_at = time.monotonic()
                if msg.snapshot:
                    # The server no longer had our history: a fresh copy follows.
                    snapshot.extend(_kv(self._root, r) for r in msg.records)
                    if msg.snapshot_done:
                        self._queue.put(_Reset(RangeResult(tuple(snapshot), msg.revision)))
                        snapshot = []
                    continue
                self._feed.failures = 0
                self._queue.put(_response(self._root, msg))
            self._feed.failures += 1
            self._queue.put(WatchDroppedError("the server ended the sync stream"))
        except grpc.RpcError as e:
            if self._cancelled:
                self._queue.put(None)
                return
            # A server shutting down may end the stream as CANCELLED too: resume.
            self._feed.failures += 1
            self._feed.client.stream_failed(self._endpoint)
            self._queue.put(WatchDroppedError(f"sync stream lost: {e.details()}"))

    def next(self, timeout: float | None = None) -> WatchResponse | None:
        if self._dropped is not None:
            raise self._dropped
        try:
            item = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            idle = self._feed.client.stream_idle_timeout
            if idle and time.monotonic() - self._heard_at > idle:
                self._give_up(f"the sync stream from {self._endpoint} was silent for "
                              f"{idle:g} s")
            return None
        if item is None:
            return None
        if isinstance(item, _Reset):
            # Hand the fresh copy to the replica through its reload path; this stream
            # goes on with the changes after it.
            self._feed.pending = item.result
            self._feed._open = (item.result.revision + 1, self)
            return WatchResponse(item.result.revision, compact_revision=item.result.revision,
                                 canceled=True)
        if isinstance(item, Exception):
            self._dropped = item
            raise item
        return item

    def _give_up(self, why: str) -> None:
        log.warning("%s; resuming on the next endpoint", why)
        self._cancelled = True  # the reader thread ends quietly
        self._stream.cancel()
        self._feed.failures += 1
        self._feed.client.stream_failed(self._endpoint)
        self._dropped = WatchDroppedError(why)
        raise self._dropped

    def request_progress(self) -> None:
        """Progress arrives on its own (the server forwards etcd's)."""

    def cancel(self) -> None:
        handover = self._feed._open
        if handover is not None and handover[1] is self:
            return  # the replica reloads from what this stream sent; keep it open
        self._cancelled = True
        self._stream.cancel()


def _kv(root: bytes, r: pb.Record) -> KeyValue:
    return KeyValue(root + r.key.encode(), r.value, r.create_revision, r.mod_revision, 0)


def _response(root: bytes, msg: pb.SyncResponse) -> WatchResponse:
    events = tuple(
        WatchEvent(EventType.DELETE if r.deleted else EventType.PUT, _kv(root, r))
        for r in msg.records
    )
    return WatchResponse(msg.revision, events)


class SyncFeed:
    """A :class:`~cellstate.replica.Feed` over the service's sync stream."""

    def __init__(self, client: CellClient) -> None:
        self.client = client
        self.pending: RangeResult | None = None  # a snapshot a stream already delivered
        self._open: tuple[int, SyncWatcher] | None = None  # (next revision, watcher)
        self.failures = 0  # streams lost in a row, for backoff while no server answers

    def load(self, prefix: bytes, revision: int = 0) -> RangeResult:
        if revision:
            raise KVError("the sync stream serves the newest state only, not past revisions")
        if self.pending is not None:
            result, self.pending = self.pending, None
            return result
        deadline = time.monotonic() + self.client.retry_for
        while True:
            endpoint, stream = self.client.stream(pb.SyncRequest(start_revision=0))
            kvs: list[KeyValue] = []
            watchdog = _Watchdog(stream, self.client.stream_idle_timeout)
            try:
                for msg in stream:
                    watchdog.touch()
                    kvs.extend(_kv(prefix, r) for r in msg.records)
                    if msg.snapshot_done:
                        watchdog.done()
                        watcher = SyncWatcher(self, endpoint, stream, prefix)
                        self._open = (msg.revision + 1, watcher)
                        return RangeResult(tuple(kvs), msg.revision)
                detail = "the server ended the stream before its snapshot was complete"
            except grpc.RpcError as e:
                detail = str(e.details())
            watchdog.done()
            if watchdog.fired:
                detail = f"{endpoint} sent nothing for {self.client.stream_idle_timeout:g} s"
            stream.cancel()
            self.client.stream_failed(endpoint)
            if time.monotonic() >= deadline:
                raise ServiceUnavailable(f"sync: no endpoint answered ({detail})")
            time.sleep(0.1)

    def watch(self, prefix: bytes, end: bytes, start_revision: int) -> SyncWatcher:
        if self._open is not None:
            nxt, watcher = self._open
            self._open = None
            if nxt == start_revision:
                return watcher
            watcher.cancel()
        if self.failures:
            time.sleep(min(0.05 * 2 ** min(self.failures, 5), 1.0) * random.uniform(0.5, 1.0))
        endpoint, stream = self.client.stream(pb.SyncRequest(start_revision=start_revision))
        return SyncWatcher(self, endpoint, stream, prefix)


def remote_replica(client: CellClient, cell: str = "default") -> Replica:
    """A synced local copy of the cell served by ``client``'s endpoints."""
    return Replica(SyncFeed(client), cell)


# -- what schedulers and agents write through ------------------------------------------


class RemoteStore:
    """The committer a :class:`~schedulers.runtime.SchedulerInstance` uses in a
    scheduler process: the server validates, so there is no local working view."""

    def __init__(self, client: CellClient) -> None:
        self.client = client
        self.instance = ""
        self._ttl = 10  # of the instance's lease, for the keep-alive deadlines

    def commit(self, txn: Transaction) -> CommitResult:
        return self.client.commit(txn, self.instance)

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """A plan's transactions in one round trip to the service."""
        return self.client.commit_many(txns, self.instance)

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        self.instance = record.instance
        self._ttl = ttl
        reply = self.client.call("RegisterInstance", pb.RegisterInstanceRequest(
            scheduler=record.scheduler, instance=record.instance, policy=record.policy,
            started_at=record.started_at, ttl=ttl), what=f"registering {record.id}")
        return int(reply.lease)

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None:
        # Shutting down: if no server answers soon, the lease lapses on its own.
        self.client.call("DeregisterInstance", pb.DeregisterInstanceRequest(
            scheduler=scheduler, instance=instance, lease=lease),
            what=f"deregistering {scheduler}/{instance}", retry_for=3.0)

    def keep_alive(self, lease: int) -> None:
        """Raises LeaseNotFoundError when the lease is gone, ServiceUnavailable when no
        server could say."""
        if self.client.keep_alive(lease, self._ttl) <= 0:
            raise LeaseNotFoundError(f"lease {lease} is gone")

    def resize_job(self, job_id: str, task_count: int) -> int:
        reply = self.client.call("ResizeJob", pb.ResizeJobRequest(job=job_id,
                                                                  task_count=task_count),
                                 what=f"resizing job {job_id}")
        return int(reply.revision)

    def set_job_status(self, status: JobStatus) -> int:
        reply = self.client.call("SetJobStatus", pb.SetJobStatusRequest(
            job=status.job, state=status.state.value, reason=status.reason, by=status.by,
            at=status.at), what=f"setting the status of job {status.job}")
        return int(reply.revision)

    def report_metrics(self, scheduler: str, instance: str, lease: int,
                       metrics: dict[str, Any]) -> None:
        self.client.call("ReportMetrics", pb.ReportMetricsRequest(
            scheduler=scheduler, instance=instance, lease=lease,
            metrics_json=orjson.dumps(metrics)), what="reporting metrics")

    def report_pending(self, scheduler: str, instance: str, lease: int,
                       puts: Mapping[str, bytes], deletes: Sequence[str]) -> None:
        """Write (``puts``: job -> report JSON) and delete pending reports, in calls of
        at most 100 (the service's limit)."""
        items = [pb.PendingReport(job=j, report_json=d) for j, d in puts.items()]
        items.extend(pb.PendingReport(job=j) for j in deletes)
        for i in range(0, len(items), 100):
            self.client.call("ReportPending", pb.ReportPendingRequest(
                scheduler=scheduler, instance=instance, lease=lease,
                reports=items[i:i + 100]), what="reporting pending jobs")


class RemoteAgentBackend:
    """The node agent's view of the cellstate service."""

    def __init__(self, client: CellClient) -> None:
        self.client = client
        self._ttl = 10  # of the agent's lease, for the keep-alive deadlines

    def register_agent(self, agent: str, machines: Sequence[Machine], ttl: int,
                       ) -> tuple[int, int]:
        """Returns (lease, revision of the registration). Many machines go in pieces
        of REGISTER_PIECE under the first piece's lease, which a thread renews until
        the last piece is in: the registration takes as long as the host lets it, and
        its lease lives throughout."""
        self._ttl = ttl
        pieces = [machines[i:i + REGISTER_PIECE]
                  for i in range(0, len(machines), REGISTER_PIECE)] or [machines]
        lease, revision = self._piece(agent, pieces[0], ttl, 0)
        if len(pieces) == 1:
            return lease, revision
        done = threading.Event()
        renewer = threading.Thread(target=self._renew_while, args=(lease, ttl, done),
                                   name=f"register-{agent}", daemon=True)
        renewer.start()
        try:
            for piece in pieces[1:]:
                _, revision = self._piece(agent, piece, ttl, lease)
        finally:
            done.set()
            renewer.join()
        return lease, revision

    def _piece(self, agent: str, machines: Sequence[Machine], ttl: int, lease: int,
               ) -> tuple[int, int]:
        reply = self.client.call("RegisterAgent", pb.RegisterAgentRequest(
            agent=agent, ttl=ttl, lease=lease,
            machines_json=[orjson.dumps(codec.machine_to_doc(m)) for m in machines]),
            what=f"registering agent {agent}",
            timeout=self.client.timeout + PER_ITEM_TIMEOUT * len(machines))
        return int(reply.lease), int(reply.revision)

    def _renew_while(self, lease: int, ttl: int, done: threading.Event) -> None:
        while not done.wait(ttl / 3):
            try:
                self.client.keep_alive(lease, ttl)
            except Exception as e:  # the next piece's call says what is wrong
                log.warning("renewing lease %x while registering failed: %s", lease, e)

    def keep_alive(self, lease: int) -> bool:
        return self.client.keep_alive(lease, self._ttl) > 0

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str,
                    result: TaskResult | None = None) -> None:
        """Raises only when the report may not have been recorded (the service is
        unavailable); a report the cell has moved past (the task was preempted, lost
        or moved meanwhile) is dropped with a log line."""
        r = result or TaskResult()
        try:
            # Briefly: the agent keeps the report and tries again with its own backoff.
            self.client.call("ReportTask", pb.ReportTaskRequest(
                task=task, outcome=outcome.value, agent=agent, machine=machine,
                has_exit_code=r.exit_code is not None, exit_code=r.exit_code or 0,
                started_at=r.started_at, ended_at=r.ended_at, detail=r.detail),
                what=f"reporting task {task} {outcome.value}",
                retry_for=min(self.client.retry_for, 5.0))
        except (NotFoundError, ContentionError) as e:
            log.info("%s", e)
        except StoreError as e:  # FAILED_PRECONDITION: not running (here) any more
            log.info("dropped: %s", e)


def wait_until_serving(address: str, timeout: float = 30.0,
                       alive: Callable[[], bool] = lambda: True,
                       tls: TlsFiles | None = None) -> None:
    """Block until the server at ``address`` answers the standard health check with
    SERVING; raises ServiceUnavailable after ``timeout`` or once ``alive()`` is false."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    # Without fast reconnects a start of 10 s was seen up to 4.6 s late: the channel's
    # attempts at 1, 2.6, 5.2, 9.4, 16 s after the first refusal (issue 36).
    with _channel(address, tls, FAST_RECONNECT) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= deadline or not alive():
                raise ServiceUnavailable(f"{address} is not serving")
            time.sleep(0.1)
