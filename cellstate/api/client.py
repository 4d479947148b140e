"""Talking to the cellstate service: for schedulers, agents and the CLI.

* :class:`CellClient`: every RPC, over several endpoints. A call that finds its
  server unavailable moves to the next endpoint and retries with backoff until its
  retry budget is spent, then raises :class:`ServiceUnavailable`. Other failures come
  back as the store's exceptions (``NotFoundError``, ``AlreadyExistsError``,
  ``TransactionError``...) with the server's message, so code written against a
  direct :class:`~cellstate.store.CellStore` handles them unchanged.
* :class:`SyncFeed`: a :class:`~cellstate.replica.Feed` over the sync stream, so a
  ``Replica(SyncFeed(client))`` is a synced local copy with the same interface as one
  that reads etcd directly. A dropped stream resumes from the last revision + 1, on
  whichever endpoint answers.
* :class:`RemoteStore`: what a scheduler instance commits through.
* :class:`RemoteAgentBackend`: what a node agent reports through.

A commit retried after its server went away may have been applied already; its
claims then come back as ``task_already_placed``, and the scheduler's copy shows the
placement: nothing is placed twice.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import orjson

from cellstate import codec
from cellstate.api import convert
from cellstate.api.pb.v1 import cellstate_pb2 as pb
from cellstate.api.pb.v1 import cellstate_pb2_grpc as pb_grpc
from cellstate.kv.base import (
    EventType,
    KeyValue,
    KVError,
    LeaseNotFoundError,
    RangeResult,
    WatchDroppedError,
    WatchEvent,
    WatchResponse,
)
from cellstate.model import (
    CommitResult,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    TaskState,
    Transaction,
)
from cellstate.replica import Replica
from cellstate.store import AlreadyExistsError, ContentionError, NotFoundError, StoreError
from cellstate.validation import TransactionError

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024 * 1024  # a snapshot of a large cell arrives in several messages


class ServiceUnavailable(KVError):
    """No cellstate endpoint answered within the retry budget."""


class ClientError(ValueError):
    """The server refused a request as malformed (INVALID_ARGUMENT)."""


def _raise_for(e: grpc.RpcError, what: str, invalid: type[Exception] = ClientError) -> None:
    code = e.code()
    msg = f"{what}: {e.details()}"
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        raise invalid(msg) from None
    if code is grpc.StatusCode.NOT_FOUND:
        raise NotFoundError(msg) from None
    if code is grpc.StatusCode.ALREADY_EXISTS:
        raise AlreadyExistsError(msg) from None
    if code is grpc.StatusCode.ABORTED:
        raise ContentionError(msg) from None
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.RESOURCE_EXHAUSTED):
        raise StoreError(msg) from None
    raise ServiceUnavailable(msg) from None


_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class CellClient:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 30.0,
        retry_for: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not endpoints:
            raise ValueError("no cellstate endpoints given")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self.retry_for = retry_for
        self._sleep = sleep
        # Reconnect quickly: a restarted server (or the next replica) should be found
        # within a second, not after gRPC's default backoff of up to two minutes.
        opts = [("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000)]
        self._channels = [grpc.insecure_channel(e, options=opts) for e in self.endpoints]
        self._stubs = [pb_grpc.CellStateStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        self._current = 0
        self._lock = threading.Lock()

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
        """Call ``method`` with retries across endpoints while they are unavailable
        (for ``retry_for`` seconds; default the client's budget)."""
        deadline = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        delay = 0.05
        while True:
            index = self._current
            try:
                return getattr(self._stubs[index], method)(
                    request, timeout=timeout or self.timeout, wait_for_ready=False)
            except grpc.RpcError as e:
                if e.code() not in _RETRYABLE or time.monotonic() >= deadline:
                    _raise_for(e, what or method, invalid)
                log.debug("%s at %s unavailable (%s); trying the next endpoint", method,
                          self.endpoints[index], e.details())
                self._next_endpoint(index)
                self._sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 1.0)

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
        reply = self.call("Commit", request, what="commit", invalid=TransactionError)
        return convert.result_from(txn, reply)

    def commit_many(self, txns: Sequence[Transaction], instance: str = "") -> list[CommitResult]:
        """Several transactions in one Commit call, answered one by one (see
        ``CellStore.commit_many``)."""
        request = pb.CommitRequest(
            transactions=[convert.transaction_to(t, instance) for t in txns])
        reply = self.call("Commit", request, what="commit", invalid=TransactionError)
        return convert.results_from(txns, reply)

    def submit_job(self, job: Job | dict[str, Any]) -> int:
        doc = codec.job_to_doc(job) if isinstance(job, Job) else job
        reply = self.call("SubmitJob", pb.SubmitJobRequest(spec_json=orjson.dumps(doc)),
                          what="submitting a job")
        return int(reply.revision)

    def get_job(self, job: str) -> dict[str, Any]:
        return job_info_doc(self.call("GetJob", pb.GetJobRequest(job=job), what=f"job {job}"))

    def list_jobs(self, scheduler: str = "", state: str = "", limit: int = 0,
                  ) -> list[dict[str, Any]]:
        reply = self.call("ListJobs", pb.ListJobsRequest(scheduler=scheduler, state=state,
                                                         limit=limit), what="listing jobs")
        return [job_info_doc(j) for j in reply.jobs]

    def kill_job(self, job: str, reason: str = "", by: str = "") -> int:
        reply = self.call("KillJob", pb.KillJobRequest(job=job, reason=reason, by=by),
                          what=f"killing job {job}")
        return int(reply.revision)

    def list_machines(self, state: str = "", limit: int = 0) -> list[dict[str, Any]]:
        reply = self.call("ListMachines", pb.ListMachinesRequest(state=state, limit=limit),
                          what="listing machines")
        return [{**orjson.loads(m.machine_json), "used": dict(m.used), "tasks": m.tasks,
                 "seq": m.seq} for m in reply.machines]

    def status(self) -> dict[str, Any]:
        s = self.call("GetStatus", pb.GetStatusRequest(), what="cell status")
        return {
            "server": s.server, "revision": s.revision, "machines_up": s.machines_up,
            "machines_down": s.machines_down, "capacity": dict(s.capacity),
            "used": dict(s.used), "jobs": dict(s.jobs), "tasks": dict(s.tasks),
            "agents": s.agents,
            "schedulers": [{"scheduler": x.scheduler, "instance": x.instance,
                            **orjson.loads(x.metrics_json)} for x in s.schedulers],
        }

    def keep_alive(self, lease: int) -> int:
        """Renew a lease; returns its ttl, 0 if it is gone."""
        # Briefly: a lease lives a few seconds, and the caller tries again soon anyway.
        return int(self.call("KeepAlive", pb.KeepAliveRequest(lease=lease), what="keep-alive",
                             retry_for=min(self.retry_for, 2.0)).ttl)


def job_info_doc(info: pb.JobInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {"spec": orjson.loads(info.spec_json), "state": info.state,
                           "task_states": dict(info.task_states), "revision": info.revision}
    if info.reason:
        doc["reason"] = info.reason
    if info.tasks:
        doc["tasks"] = [{"index": t.index, "state": t.state, "machine": t.machine}
                        for t in info.tasks]
    return doc


# -- the synced local copy -----------------------------------------------------------


class _Reset(Exception):
    def __init__(self, result: RangeResult) -> None:
        self.result = result


class SyncWatcher:
    """The rest of a sync stream as a :class:`~cellstate.kv.base.Watcher`; a thread
    reads the stream into a queue so that :meth:`next` can time out."""

    def __init__(self, feed: SyncFeed, endpoint: str, stream: Any, root: bytes) -> None:
        self._feed = feed
        self._endpoint = endpoint
        self._stream = stream
        self._root = root
        self._queue: queue.SimpleQueue[WatchResponse | Exception | None] = queue.SimpleQueue()
        self._dropped: Exception | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._read, name="sync-stream", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            snapshot: list[KeyValue] = []
            for msg in self._stream:
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
            try:
                for msg in stream:
                    kvs.extend(_kv(prefix, r) for r in msg.records)
                    if msg.snapshot_done:
                        watcher = SyncWatcher(self, endpoint, stream, prefix)
                        self._open = (msg.revision + 1, watcher)
                        return RangeResult(tuple(kvs), msg.revision)
                detail = "the server ended the stream before its snapshot was complete"
            except grpc.RpcError as e:
                detail = str(e.details())
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

    def commit(self, txn: Transaction) -> CommitResult:
        return self.client.commit(txn, self.instance)

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """A plan's transactions in one round trip to the service."""
        return self.client.commit_many(txns, self.instance)

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        self.instance = record.instance
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
        if self.client.keep_alive(lease) <= 0:
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


class RemoteAgentBackend:
    """The node agent's view of the cellstate service."""

    def __init__(self, client: CellClient) -> None:
        self.client = client

    def register_agent(self, agent: str, machines: Sequence[Machine], ttl: int) -> int:
        reply = self.client.call("RegisterAgent", pb.RegisterAgentRequest(
            agent=agent, ttl=ttl,
            machines_json=[orjson.dumps(codec.machine_to_doc(m)) for m in machines]),
            what=f"registering agent {agent}")
        return int(reply.lease)

    def keep_alive(self, lease: int) -> bool:
        return self.client.keep_alive(lease) > 0

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str) -> None:
        """Raises only when the report may not have been recorded (the service is
        unavailable); a report the cell has moved past (the task was preempted, lost
        or moved meanwhile) is dropped with a log line."""
        try:
            # Briefly: the agent keeps the report and tries again with its own backoff.
            self.client.call("ReportTask", pb.ReportTaskRequest(
                task=task, outcome=outcome.value, agent=agent, machine=machine),
                what=f"reporting task {task} {outcome.value}",
                retry_for=min(self.client.retry_for, 5.0))
        except (NotFoundError, ContentionError) as e:
            log.info("%s", e)
        except StoreError as e:  # FAILED_PRECONDITION: not running (here) any more
            log.info("dropped: %s", e)


def wait_until_serving(address: str, timeout: float = 30.0,
                       alive: Callable[[], bool] = lambda: True) -> None:
    """Block until the server at ``address`` answers the standard health check with
    SERVING; raises ServiceUnavailable after ``timeout`` or once ``alive()`` is false."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
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
