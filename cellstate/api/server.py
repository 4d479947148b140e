"""The cellstate server: the gRPC face of one cell.

Stateless over etcd: every decision it takes is an etcd transaction guarded by the
revisions of what it read, so any number of replicas can serve the same cell at once
and two of them can never both commit conflicting claims. Each replica holds one etcd
watch (its :class:`~cellstate.replica.Replica`), which feeds both its store handles'
working views and the :class:`~cellstate.api.watchcache.WatchCache` that serves every
sync subscriber. It also takes down the machines of agents whose lease lapsed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from typing import Any, TypeVar

import attrs
import grpc
import orjson
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cellstate import admission, codec
from cellstate.admission import UnschedulableError
from cellstate.api import convert
from cellstate.api.auth import (
    Authorizer,
    PermissionDenied,
    Unauthenticated,
    check_changeable,
)
from cellstate.api.config import ServerConfig
from cellstate.api.leader import Election, GroupCommitter
from cellstate.api.metrics import ServerMetrics
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.revocation import Revocations
from cellstate.api.tls import channel_credentials, server_credentials
from cellstate.api.watchcache import FellBehind, WatchCache
from cellstate.cell import CellSnapshot, machine_used, task_view
from cellstate.decisions import MACHINE_ACTIONS
from cellstate.errors import ConfigError, FencedOut, NotPermittedError, ReplicaBehindError
from cellstate.jobinfo import StatusIndex, StatusView
from cellstate.keys import (
    KeyKind,
    metrics_prefix as metrics_prefix,
    pending_prefix as pending_prefix,
)
from cellstate.kv.base import (
    KV,
    Compare,
    CompareResult,
    CompareTarget,
    Delete,
    KVError,
    LeaseNotFoundError,
    Put,
    TxnTooLargeError,
    prefix_end,
)
from cellstate.kv.etcd import EtcdKV
from cellstate.maintenance import Maintainer, MaintenancePolicy
from cellstate.model import (
    AGENT_OUTCOMES,
    MAX_DETAIL,
    CellConfig,
    CommitResult,
    InstanceRecord,
    Job,
    JobState,
    JobStatus,
    MachineState,
    ModelError,
    SchedulerLimits,
    TaskResult,
    TaskState,
    Transaction,
    check_name,
    control_at,
    split_task_id,
)
from cellstate.replica import Replica
from cellstate.store import (
    AlreadyExistsError,
    CellStore,
    ContentionError,
    NotFoundError,
    StoreError,
    StoreOptions,
)
from cellstate.validation import TransactionError, check_batch, check_shape

log = logging.getLogger(__name__)

SERVICE_NAME = "omega.cellstate.v1.CellState"
_FORWARDED = "omega-forwarded"  # metadata of a commit a follower forwards to the leader
T = TypeVar("T")

# A job spec is one etcd put and travels to every scheduler in sync snapshots. 1 MiB
# leaves room under etcd's default --max-request-bytes (1.5 MiB) for the request around
# it; a spec anywhere near it is a mistake (a million labels), not a job.
MAX_JOB_SPEC_BYTES = 1024 * 1024
# A scheduler's metrics report is a summary (about 600 bytes today). Every live
# instance has at most one, and GetStatus returns all of them in one reply: at 16 KiB,
# 200 instances stay under gRPC's default 4 MiB receive limit of a third-party client.
MAX_METRICS_BYTES = 16 * 1024


# Machines one RegisterAgent call carries at most: a larger agent registers in pieces
# under the lease of its first (RegisterAgentRequest.lease), renewing it in between, so
# no single call on a busy host outlasts the lease it just made (issue 36: an agent of
# 6,882 machines in one call lost its lease before the call returned).
MAX_REGISTER_MACHINES = 1000

# Pending reports (schedulers/why.py): one per job and instance, small (a few reasons).
MAX_PENDING_BYTES = 8 * 1024
MAX_PENDING_REPORTS = 100  # per call: puts and deletes in one etcd transaction
# How long a status read waits for this server's copy of the cell to reach the revision
# it must show (normally milliseconds behind). Past it the server answers UNAVAILABLE
# and a client asks the next endpoint.
READ_WAIT = 3.0  # under a client's 5 s deadline, so it hears why


def _span(ids: list[str]) -> str:
    """A list of machine ids, short: the first and last of many."""
    return ", ".join(ids) if len(ids) <= 4 else f"{ids[0]} ... {ids[-1]}"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> Any:
    context.abort(code, message)  # raises


# The store's and model's errors, most specific first, and the status each becomes.
_STATUS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], grpc.StatusCode], ...] = (
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    ((PermissionDenied, NotPermittedError), grpc.StatusCode.PERMISSION_DENIED),
    ((convert.WireError, ModelError, TransactionError), grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (ContentionError, grpc.StatusCode.ABORTED),
    ((ReplicaBehindError, FencedOut), grpc.StatusCode.UNAVAILABLE),
    (StoreError, grpc.StatusCode.FAILED_PRECONDITION),
)


def rpc(handler: Callable[..., T]) -> Callable[..., T]:
    """Map the model's and store's errors to gRPC status codes with their message."""

    @functools.wraps(handler)
    def wrapper(self: CellStateService, request: Any, context: grpc.ServicerContext) -> T:
        try:
            return handler(self, request, context)
        except TxnTooLargeError as e:
            # Sending it again cannot help: not a reason to retry (UNAVAILABLE).
            return _abort(context, grpc.StatusCode.INVALID_ARGUMENT,  # type: ignore[no-any-return]
                          f"the write is too large for etcd: {e}")
        except KVError as e:
            return _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")  # type: ignore[no-any-return]
        except Exception as e:
            for kinds, code in _STATUS:
                if isinstance(e, kinds):
                    return _abort(context, code, str(e))  # type: ignore[no-any-return]
            raise

    return wrapper


class StorePool:
    """Store handles for concurrent requests: a CellStore does one write at a time.
    The most recently used handle goes out first: its working view is the freshest,
    so a lone scheduler's commits do not rotate through stale views and retry."""

    def __init__(self, kv: KV, cell: str, replica: Replica, size: int) -> None:
        self._free: queue.LifoQueue[CellStore] = queue.LifoQueue()
        for _ in range(size):
            store = CellStore(kv, cell)
            store.follow(replica)
            self._free.put(store)

    @contextlib.contextmanager
    def get(self) -> Iterator[CellStore]:
        store = self._free.get()
        try:
            yield store
        finally:
            self._free.put(store)


class CellStateService(pb_grpc.CellStateServicer):
    def __init__(self, kv: KV, config: ServerConfig, replica: Replica,
                 cache: WatchCache, clock: Callable[[], float] = time.time) -> None:
        self.kv = kv
        self.config = config
        self.replica = replica
        self.cache = cache
        self.status = StatusIndex(replica)  # per-job counts: status calls in O(jobs)
        self.keys = replica.keys
        self.clock = clock
        self.stores = StorePool(kv, config.cell, replica, config.committers)
        self.maintainer: Maintainer | None = None  # set by CellStateServer (etcd only)
        # Revoked certificates are refused on every call (cellstate/api/revocation.py).
        self.revocations = (Revocations(config.crl, config.tls.ca)
                            if config.crl is not None and config.tls is not None else None)
        self.auth = Authorizer(config.auth, replica.snapshot,  # cellstate/api/auth.py
                               self.revocations.revoked if self.revocations else None)
        self.metrics: ServerMetrics | None = None  # set by whoever serves Prometheus
        # The newest revision a user's write through this service made (jobs, machine
        # states): status reads show it. Schedulers' commits and agents' reports, many a
        # second, are left out: their callers read from replicas of their own.
        self._written = 0
        self._written_lock = threading.Lock()
        # The commit leader (cellstate/api/leader.py): set by CellStateServer when the
        # configuration asks for one; None commits here, through the store pool.
        self.election: Election | None = None
        self._committer: GroupCommitter | None = None
        self._lead_lock = threading.Lock()
        self._peers: dict[str, tuple[grpc.Channel, pb_grpc.CellStateStub]] = {}

    # -- the commit leader -------------------------------------------------------------

    def lead(self, token: int) -> None:
        """Elected: commit through a fresh store handle fenced by ``token``. Its working
        view follows the replica and learns the rest from etcd as it validates (the
        previous leader's last writes included: their guards would fail otherwise)."""
        assert self.election is not None
        # Pipelined: one nested transaction per machine in one etcd request, so a batch
        # of about 100 machines fits one request (a flat one holds about 80 claims at
        # --max-txn-ops=256: three puts each) and a machine an outside writer (an
        # agent, a submit) changed costs only its own claims a second decision.
        # Otherwise only this handle writes claims: one flat Txn per group.
        pipeline = self.config.commit_pipeline
        store = CellStore(self.kv, self.config.cell, options=StoreOptions(
            per_machine_writes="always" if pipeline else "never"), clock=self.clock)
        store.follow(self.replica)
        store.fence(self.election.key, token)
        with self._lead_lock:
            self._committer = GroupCommitter(store, pipeline=pipeline).start()

    def step_down(self) -> None:
        """Deposed (or stopping): commits queued here fail with UNAVAILABLE; their
        clients retry through another server, which forwards to the new leader."""
        with self._lead_lock:
            committer, self._committer = self._committer, None
        if committer is not None:
            committer.close()
            log.info("commit leadership ended: %s", committer.describe())

    @property
    def committer(self) -> GroupCommitter | None:
        return self._committer

    def _commit(self, txns: list[Transaction], request: pb.CommitRequest,
                context: grpc.ServicerContext) -> list[CommitResult] | pb.CommitResponse:
        """Commit checked ``txns``: here (no leader configured, or this server leads),
        else forwarded to the leader as is (its reply is the caller's)."""
        if self.election is None:
            with self.stores.get() as store:
                if request.HasField("transaction"):
                    return [store.commit(txns[0])]
                return store.commit_many(txns)
        committer = self._committer
        if committer is not None:
            try:
                return committer.commit(txns)
            except FencedOut:
                if self.election.leading:
                    self.election.lost()
                raise
        if (_FORWARDED, "1") in (context.invocation_metadata() or ()):
            # Sent here by a server that took this one for the leader: no second hop
            # (two servers with stale views of the election would pass it around).
            raise FencedOut(f"server {self.config.name} does not lead commits (any more); "
                            "try again")
        return self._forward(request, context)

    def _forward(self, request: pb.CommitRequest, context: grpc.ServicerContext,
                 ) -> pb.CommitResponse:
        """Hand a commit to the leader. Forwarding (rather than telling the client
        where the leader is) keeps clients unaware of the election: they keep their
        server (and its sync stream) and their failover; a follower only adds a hop."""
        assert self.election is not None
        leader = self.election.leader() or self.election.refresh()
        if leader is None or leader.address == self.election.address:
            raise FencedOut(f"server {self.config.name}: no commit leader elected yet; "
                            "try again")
        stub = self._peer(leader.address)
        remaining = context.time_remaining()
        try:
            reply: pb.CommitResponse = stub.Commit(
                request, timeout=remaining if remaining is not None else 30.0,
                metadata=((_FORWARDED, "1"),))
        except grpc.RpcError as e:
            code = e.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.election.refresh()
                raise FencedOut(f"server {self.config.name}: the commit leader at "
                                f"{leader.address} did not answer ({e.details()}); "
                                "try again") from None
            return _abort(context, code, e.details() or "")  # type: ignore[no-any-return]
        return reply

    def _peer(self, address: str) -> pb_grpc.CellStateStub:
        with self._lead_lock:
            held = self._peers.get(address)
            if held is None:
                opts = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                        ("grpc.max_send_message_length", self.config.max_message_bytes)]
                tls = self.config.tls
                channel = (grpc.secure_channel(address, channel_credentials(tls), options=opts)
                           if tls is not None else grpc.insecure_channel(address, options=opts))
                stub = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
                held = self._peers[address] = (channel, stub)
            return held[1]

    def close_peers(self) -> None:
        with self._lead_lock:
            peers, self._peers = self._peers, {}
        for channel, _ in peers.values():
            channel.close()

    @property
    def snap(self) -> CellSnapshot:
        return self.replica.snapshot()

    def _cell_revision(self) -> int:
        """The cell's revision in etcd now (one small read)."""
        return self.kv.range(self.keys.config).revision

    def _wrote(self, revision: int) -> int:
        with self._written_lock:
            self._written = max(self._written, revision)
        return revision

    def _view(self, min_revision: int) -> StatusView:
        """The status answers for a read: they show every job or machine change made
        through this service and the caller's ``min_revision`` (a revision some write returned to
        it, maybe through another server). The replica follows etcd a moment behind
        the writes, so a read may wait for it, at most READ_WAIT seconds."""
        if min_revision < 0:
            raise convert.WireError(f"min_revision: {min_revision} is not a revision (>= 0)")
        want = max(min_revision, self._written)
        view = self.status.view()
        if view.snap.revision >= want:
            return view
        if min_revision > view.snap.revision:
            current = self._cell_revision()
            if min_revision > current:
                raise convert.WireError(
                    f"min_revision {min_revision} is in the future: the cell is at "
                    f"revision {current}")
        fresh = self.status.view_at(want, READ_WAIT)
        if fresh is None:
            raise ReplicaBehindError(
                f"server {self.config.name}: its copy of the cell is at revision "
                f"{self.status.view().snap.revision}, not yet at {want} after "
                f"{READ_WAIT:g} s; ask another server or again")
        return fresh

    # -- transactions and sync -------------------------------------------------------

    @rpc
    def Commit(self, request: pb.CommitRequest, context: grpc.ServicerContext,
               ) -> pb.CommitResponse:
        txns = convert.transactions_from(request)
        self.auth.commit(context, txns)
        started = time.perf_counter()
        single = request.HasField("transaction")
        if single:
            check_shape(txns[0])  # a malformed transaction is told so, registered or not
            self._check_registered(txns[0].scheduler, request.transaction.instance, context)
        else:
            check_batch(txns)
            for who in dict.fromkeys((t.scheduler, m.instance)
                                     for t, m in zip(txns, request.transactions, strict=True)):
                self._check_registered(*who, context)
        results = self._commit(txns, request, context)
        if isinstance(results, pb.CommitResponse):
            return results  # forwarded: the leader answered (and counted it)
        if self.metrics is not None:
            self.metrics.observe(time.perf_counter() - started, txns, results)
        if single:
            return convert.result_to(txns[0], results[0])
        return pb.CommitResponse(results=[convert.result_to(t, r)
                                          for t, r in zip(txns, results, strict=True)])

    def _check_registered(self, scheduler: str, instance: str,
                          context: grpc.ServicerContext) -> None:
        """Only live scheduler instances commit: an instance registers (a leased key)
        first. The key may have been written through another replica a moment ago, so
        a miss in the local copy is checked against etcd before refusing."""
        if not scheduler:
            raise convert.WireError("transaction.scheduler is empty")
        if instance:
            if f"{scheduler}/{instance}" in self.snap.instances:
                return
            if self.kv.range(self.keys.instance(scheduler, instance)).kvs:
                return
            who = f"instance {scheduler}/{instance}"
        else:
            if self.snap.live_instances(scheduler):
                return
            prefix = self.keys.prefix(KeyKind.INSTANCE) + scheduler.encode() + b"/"
            if self.kv.range(prefix, prefix_end(prefix), limit=1).kvs:
                return
            who = f"scheduler {scheduler!r}"
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
               f"{who} is not registered (no live instance); call RegisterInstance first")

    def Sync(self, request: pb.SyncRequest, context: grpc.ServicerContext,
             ) -> Iterator[pb.SyncResponse]:
        try:
            self.auth.read(context)
        except Unauthenticated as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
        if request.start_revision < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start_revision must be >= 0")
        future = self._future_revision(request.start_revision)
        if future:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, future)
        sub = self.cache.subscribe(request.start_revision)
        context.add_callback(lambda: self.cache.unsubscribe(sub))
        try:
            yield from sub.messages()
        except FellBehind as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{e}; resume from your revision")
        finally:
            self.cache.unsubscribe(sub)

    def _future_revision(self, start: int) -> str:
        """Why a sync from ``start`` can never be served (it would wait for a revision
        the cell has not reached), or "" if it can. The revision after the newest one is
        where a caller that is up to date resumes. This replica may lag others that the
        caller synced from, so a revision beyond its cache is checked against etcd."""
        if start <= self.cache.revision + 1:
            return ""
        try:
            current = self._cell_revision()
        except KVError:
            return ""  # cannot tell: serve it; the stream waits as it would anyway
        if start <= current + 1:
            return ""
        return (f"start_revision {start} is in the future: the cell is at revision "
                f"{current}; resume from a revision you have seen + 1, or 0 for a snapshot")

    # -- jobs ------------------------------------------------------------------------

    @rpc
    def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.ServicerContext,
                  ) -> pb.SubmitJobResponse:
        doc = self.auth.with_owner(context, convert.json_doc(request.spec_json, "spec_json"))
        job = codec.parse_job(doc, "job")
        self.auth.submit(context, job)
        if not job.submitted_at:
            job = attrs.evolve(job, submitted_at=self.clock())
        size, limit = len(codec.encode_job(job)), self._job_spec_limit()
        if size > limit:
            raise convert.WireError(
                f"job {job.id}: its spec is {size} bytes encoded, above the limit of "
                f"{limit} bytes")
        self._admit(job, request.allow_unknown_scheduler)
        with self.stores.get() as store:
            revision = self._wrote(store.submit_job(job))
        return pb.SubmitJobResponse(job=job.id, revision=revision)

    def _may_change(self, context: grpc.ServicerContext, job_id: str, what: str,
                    scheduler_may: bool, kill: bool = False) -> None:
        self.auth.change_job(context, job_id, what, scheduler_may)
        view = self.status.view()
        job = view.snap.jobs.get(job_id)
        if job is not None:
            summary = view.job(job)
            check_changeable(summary.state, job_id, what, kill,
                             summary.task_states.get("running", 0))

    def _admit(self, job: Job, allow_unknown_scheduler: bool = False) -> None:
        """Refuse at once what can never run (``cellstate.admission.refusal``). A
        scheduler this replica has not seen may have registered through another one a
        moment ago: etcd is asked before refusing."""
        snap = self.snap
        known = allow_unknown_scheduler or job.scheduler in snap.schedulers or bool(
            snap.schedulers and self.kv.range(self.keys.scheduler(job.scheduler)).kvs)
        why = admission.refusal(snap, job, known)
        if why is None:
            return
        raise UnschedulableError(f"job {job.id} can never run, refused: {why}")

    def _why(self, view: StatusView, job: Job) -> bytes:
        """Why the job's waiting tasks wait: the cell's own reasons and each scheduler
        instance's last report (read from etcd: they are not in the replica)."""
        prefix = pending_prefix(self.config.cell, job.id)
        reports = []
        for kv in self.kv.range(prefix, prefix_end(prefix)).kvs:
            scheduler, _, instance = kv.key[len(prefix):].decode().partition("/")
            try:
                doc = orjson.loads(kv.value)
            except orjson.JSONDecodeError:
                continue
            reports.append({"scheduler": scheduler, "instance": instance, **doc})
        doc = {"cell": [b.to_doc() for b in admission.blockers(view.snap, job)],
               "schedulers": reports}
        return orjson.dumps(doc)

    def _job_spec_limit(self) -> int:
        return min(MAX_JOB_SPEC_BYTES, self.kv.max_request_bytes - 4096)

    def _job_info(self, view: StatusView, job_id: str, tasks: bool) -> pb.JobInfo:
        snap = view.snap
        job = snap.jobs[job_id]
        s = view.job(job)
        info = pb.JobInfo(spec_json=orjson.dumps(codec.job_to_doc(job)), state=s.state,
                          reason=s.reason, task_states=s.task_states, revision=job.revision)
        if tasks:
            _add_tasks(info, snap, job_id, job.task_count)
        return info

    @rpc
    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.JobInfo:
        self.auth.read(context)
        view = self._view(request.min_revision)
        if request.job not in view.snap.jobs:
            view = self._job_view(request.job)
        info = self._job_info(view, request.job, tasks=True)
        job = view.snap.jobs[request.job]
        if info.task_states.get("pending", 0) and request.job not in view.snap.statuses:
            info.why_json = self._why(view, job)
        return info

    def _job_view(self, job_id: str) -> StatusView:
        """A view that holds a job this server's copy does not have yet, if etcd has
        it: a caller that submitted through another server and did not say so
        (``min_revision``) still finds its job."""
        found = self.kv.range(self.keys.job(job_id)).kvs
        if not found:
            raise NotFoundError(f"unknown job {job_id!r}")
        return self._view(found[0].mod_revision)

    @rpc
    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext,
                 ) -> pb.ListJobsResponse:
        self.auth.read(context)
        view = self._view(request.min_revision)
        snap = view.snap
        out = pb.ListJobsResponse(revision=snap.revision)
        for job in sorted(snap.jobs.values(), key=lambda j: (j.submitted_at, j.id),
                          reverse=request.newest_first):
            if request.scheduler and job.scheduler != request.scheduler:
                continue
            info = self._job_info(view, job.id, tasks=False)
            if request.state and info.state != request.state:
                continue
            out.jobs.append(info)
            if request.limit and len(out.jobs) >= request.limit:
                break
        return out

    @rpc
    def KillJob(self, request: pb.KillJobRequest, context: grpc.ServicerContext,
                ) -> pb.KillJobResponse:
        """Mark the job killed (its scheduler stops placing it) and end its running
        tasks, which frees their resources; their agents stop them."""
        self._may_change(context, request.job, "kill", scheduler_may=False, kill=True)
        status = JobStatus(request.job, JobState.KILLED, request.reason or "killed by a user",
                           self.auth.recorded_by(context, request.by, "user"), self.clock())
        with self.stores.get() as store:
            revision = self._wrote(store.kill_job(status))
        return pb.KillJobResponse(revision=revision)

    @rpc
    def SetJobStatus(self, request: pb.SetJobStatusRequest, context: grpc.ServicerContext,
                     ) -> pb.SetJobStatusResponse:
        try:
            state = JobState(request.state)
        except ValueError:
            raise convert.WireError(
                f"state: {request.state!r} is not one of abandoned, killed") from None
        # A scheduler abandons its jobs; killing one is its owner's (or an operator's).
        killing = state is JobState.KILLED
        self._may_change(context, request.job, "kill" if killing else "set the status of",
                         scheduler_may=not killing, kill=killing)
        by = self.auth.recorded_by(context, request.by, "")
        # The time is the server's, as a user's job's arrival is: only operators (a
        # workload replay) and a cell without identities say it themselves.
        at = request.at if self.auth.may_set_times(context) else self.clock()
        with self.stores.get() as store:
            revision = self._wrote(store.set_job_status(
                JobStatus(request.job, state, request.reason, by, at)))
        return pb.SetJobStatusResponse(revision=revision)

    @rpc
    def ResizeJob(self, request: pb.ResizeJobRequest, context: grpc.ServicerContext,
                  ) -> pb.ResizeJobResponse:
        self._may_change(context, request.job, "resize", scheduler_may=True)
        with self.stores.get() as store:
            # A scale-down through the service stops what runs beyond the new count
            # (highest index first) rather than refusing it (issue 34).
            revision = self._wrote(store.resize_job(request.job, request.task_count,
                                                    stop=True))
        return pb.ResizeJobResponse(revision=revision)

    # -- machines and status ---------------------------------------------------------

    @rpc
    def ListMachines(self, request: pb.ListMachinesRequest, context: grpc.ServicerContext,
                     ) -> pb.ListMachinesResponse:
        self.auth.read(context)
        if request.state:
            try:
                wanted = MachineState(request.state)
            except ValueError:
                raise convert.WireError(
                    f"state: {request.state!r} is not one of up, cordoned, draining, down"
                ) from None
        snap = self._view(request.min_revision).snap
        out = pb.ListMachinesResponse(revision=snap.revision)
        for mid in sorted(snap.machines):
            m = snap.machines[mid]
            if request.state and m.state is not wanted:
                continue
            out.machines.append(pb.MachineInfo(
                machine_json=orjson.dumps(codec.machine_to_doc(m)),
                used=machine_used(m, snap.gangs).as_dict(), tasks=len(m.allocations), seq=m.seq))
            if request.limit and len(out.machines) >= request.limit:
                break
        return out

    @rpc
    def SetMachineState(self, request: pb.SetMachineStateRequest,
                        context: grpc.ServicerContext) -> pb.SetMachineStateResponse:
        check_name(request.machine, "machine")
        if request.action not in MACHINE_ACTIONS:
            raise convert.WireError(f"action: {request.action!r} is not one of "
                                    f"{', '.join(MACHINE_ACTIONS)}")
        self.auth.operate_machine(context, request.machine, request.action)
        with self.stores.get() as store:
            revision, state, lost = store.set_machine_state(request.machine, request.action)
        self._wrote(revision)
        return pb.SetMachineStateResponse(revision=revision, state=state.value,
                                          tasks_lost=lost)

    @rpc
    def SetLimits(self, request: pb.SetLimitsRequest,
                  context: grpc.ServicerContext) -> pb.SetLimitsResponse:
        check_name(request.scheduler, "scheduler")
        try:
            changes = orjson.loads(request.changes_json)
        except orjson.JSONDecodeError as e:
            raise convert.WireError(f"changes_json: not JSON ({e})") from None
        self.auth.set_limits(context, request.scheduler)
        with self.stores.get() as store:
            revision, now = store.update_limits(
                request.scheduler,
                lambda current: codec.changed_limits(request.scheduler, current, changes))
        self._wrote(revision)
        doc = codec.limits_to_doc(now)
        if now.max_resources is not None:  # what it holds of them, as GetStatus says
            held = admission.held_by(self._view(revision).snap, request.scheduler)
            doc["used"] = held.as_dict()
        return pb.SetLimitsResponse(revision=revision, limits_json=orjson.dumps(doc))

    @rpc
    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext,
                  ) -> pb.CellStatus:
        self.auth.read(context)
        view = self._view(request.min_revision)
        totals = view.totals()
        out = pb.CellStatus(
            revision=totals["revision"], machines_up=totals["machines_up"],
            machines_down=totals["machines_down"], capacity=totals["capacity"],
            used=totals["used"], jobs=totals["jobs"], tasks=totals["tasks"],
            agents=totals["agents"], server=self.config.name,
            limits_json=orjson.dumps(admission.limits_report(view.snap)),
        )
        report = self.maintainer.last_report if self.maintainer is not None else None
        if report is not None:
            out.etcd_json = orjson.dumps(report.to_doc())
        prefix = metrics_prefix(self.config.cell)
        for kv in self.kv.range(prefix, prefix_end(prefix)).kvs:
            scheduler, _, instance = kv.key[len(prefix):].decode().partition("/")
            out.schedulers.append(pb.SchedulerStatus(scheduler=scheduler, instance=instance,
                                                     metrics_json=kv.value))
        return out

    # -- scheduler instances ---------------------------------------------------------

    @rpc
    def RegisterInstance(self, request: pb.RegisterInstanceRequest,
                         context: grpc.ServicerContext) -> pb.RegisterInstanceResponse:
        check_name(request.scheduler, "scheduler")
        check_name(request.instance, "instance")
        self.auth.as_scheduler(context, request.scheduler, "register an instance")
        if not 1 <= request.ttl <= 3600:
            raise convert.WireError(f"ttl: {request.ttl} is not between 1 and 3600 seconds")
        record = InstanceRecord(request.scheduler, request.instance, request.policy,
                                request.started_at or self.clock())
        with self.stores.get() as store:
            lease = store.register_instance(record, request.ttl)
        return pb.RegisterInstanceResponse(lease=lease)

    @rpc
    def DeregisterInstance(self, request: pb.DeregisterInstanceRequest,
                           context: grpc.ServicerContext) -> pb.DeregisterInstanceResponse:
        self.auth.as_scheduler(context, request.scheduler, "deregister an instance")
        if not request.lease:
            raise convert.WireError("lease: 0 is no lease; deregistering needs the lease the "
                                    "instance registered with")
        with self.stores.get() as store:
            store.deregister_instance(request.scheduler, request.instance, request.lease)
        return pb.DeregisterInstanceResponse()

    @rpc
    def KeepAlive(self, request: pb.KeepAliveRequest, context: grpc.ServicerContext,
                  ) -> pb.KeepAliveResponse:
        try:
            self.auth.keep_alive(context, request.lease, self.config.cell,
                                 lambda: self.kv.lease_keys(request.lease))
            ttl = self.kv.lease_keepalive(request.lease)
        except LeaseNotFoundError:
            ttl = 0
        return pb.KeepAliveResponse(ttl=ttl)

    @rpc
    def ReportMetrics(self, request: pb.ReportMetricsRequest, context: grpc.ServicerContext,
                      ) -> pb.ReportMetricsResponse:
        """Keep an instance's latest metrics report, attached to its registration's lease
        (so it goes with the instance) and only while the instance key is attached to
        that lease: at most one report per live instance, none that outlives it."""
        who = f"instance {request.scheduler}/{request.instance}"
        check_name(request.scheduler, "scheduler")
        check_name(request.instance, "instance")
        self.auth.as_scheduler(context, request.scheduler, "report metrics")
        if len(request.metrics_json) > MAX_METRICS_BYTES:
            raise convert.WireError(f"metrics_json: {len(request.metrics_json)} bytes, above "
                                    f"the limit of {MAX_METRICS_BYTES} bytes")
        if not request.lease:
            raise convert.WireError("lease: 0 is no lease; report under the lease the "
                                    "instance registered with")
        doc = convert.json_doc(request.metrics_json, "metrics_json")
        if not isinstance(doc, dict):
            raise convert.WireError("metrics_json: expected a JSON object")
        key = metrics_prefix(self.config.cell) + f"{request.scheduler}/{request.instance}".encode()
        ikey = self.keys.instance(request.scheduler, request.instance)
        registered = Compare(ikey, CompareTarget.LEASE, CompareResult.EQUAL, request.lease)
        try:
            res = self.kv.txn([registered], [Put(key, request.metrics_json, request.lease)])
        except LeaseNotFoundError:
            res = None
        if res is None or not res.succeeded:
            raise StoreError(f"{who} is not registered under lease {request.lease}; "
                             "register again")
        return pb.ReportMetricsResponse()

    @rpc
    def ReportPending(self, request: pb.ReportPendingRequest, context: grpc.ServicerContext,
                      ) -> pb.ReportPendingResponse:
        """Keep (or delete) an instance's reports of why jobs wait, attached to its
        registration's lease and only while the instance key is on that lease, as
        ReportMetrics does."""
        check_name(request.scheduler, "scheduler")
        check_name(request.instance, "instance")
        self.auth.report_pending(context, request.scheduler,
                                 [r.job for r in request.reports if r.report_json])
        if not request.lease:
            raise convert.WireError("lease: 0 is no lease; report under the lease the "
                                    "instance registered with")
        if len(request.reports) > MAX_PENDING_REPORTS:
            raise convert.WireError(f"reports: {len(request.reports)}, above the limit of "
                                    f"{MAX_PENDING_REPORTS} per call")
        ops: list[Put | Delete] = []
        suffix = f"/{request.scheduler}/{request.instance}".encode()
        for i, r in enumerate(request.reports):
            check_name(r.job, f"reports[{i}].job")
            key = pending_prefix(self.config.cell) + r.job.encode() + suffix
            if not r.report_json:
                ops.append(Delete(key))
                continue
            if len(r.report_json) > MAX_PENDING_BYTES:
                raise convert.WireError(f"reports[{i}]: {len(r.report_json)} bytes, above "
                                        f"the limit of {MAX_PENDING_BYTES} bytes")
            doc = convert.json_doc(r.report_json, f"reports[{i}]")
            if not isinstance(doc, dict):
                raise convert.WireError(f"reports[{i}]: expected a JSON object")
            _check_printable(doc, f"reports[{i}]")
            ops.append(Put(key, r.report_json, request.lease))
        if not ops:
            return pb.ReportPendingResponse()
        ikey = self.keys.instance(request.scheduler, request.instance)
        registered = Compare(ikey, CompareTarget.LEASE, CompareResult.EQUAL, request.lease)
        try:
            res = self.kv.txn([registered], ops)
        except LeaseNotFoundError:
            res = None
        if res is None or not res.succeeded:
            raise StoreError(f"instance {request.scheduler}/{request.instance} is not "
                             f"registered under lease {request.lease}; register again")
        return pb.ReportPendingResponse()

    # -- agents ----------------------------------------------------------------------

    @rpc
    def RegisterAgent(self, request: pb.RegisterAgentRequest, context: grpc.ServicerContext,
                      ) -> pb.RegisterAgentResponse:
        if len(request.machines_json) > MAX_REGISTER_MACHINES:
            raise convert.WireError(
                f"machines_json: {len(request.machines_json)} machines, above the limit of "
                f"{MAX_REGISTER_MACHINES} a call; register the rest in further calls "
                "under the first one's lease (RegisterAgentRequest.lease)")
        machines = [
            codec.parse_machine(convert.json_doc(m, f"machines_json[{i}]"), f"machines_json[{i}]")
            for i, m in enumerate(request.machines_json)
        ]
        if not request.lease and not 1 <= request.ttl <= 3600:
            raise convert.WireError(f"ttl: {request.ttl} is not between 1 and 3600 seconds")
        if request.lease < 0:
            raise convert.WireError(f"lease: {request.lease} is not a lease (0 for a new one)")
        as_agent = self.auth.register_agent(context, request.agent, machines)
        with self.stores.get() as store:
            if request.lease:
                lease = request.lease
                revision = store.extend_agent(request.agent, machines, lease,
                                              as_agent=as_agent)
            else:
                lease, revision = store.register_agent(request.agent, machines, request.ttl,
                                                       self.clock(), as_agent=as_agent)
        return pb.RegisterAgentResponse(lease=lease, revision=revision)

    @rpc
    def ReportTask(self, request: pb.ReportTaskRequest, context: grpc.ServicerContext,
                   ) -> pb.ReportTaskResponse:
        try:
            outcome = TaskState(request.outcome)
        except ValueError:
            outcome = None
        if outcome not in AGENT_OUTCOMES:
            raise convert.WireError(
                f"outcome: {request.outcome!r} is not one of finished, failed, lost")
        assert outcome is not None
        split_task_id(request.task)  # a malformed id is the caller's error
        result = _task_result(request)
        machine = self.auth.report_task(context, request.agent, request.task,
                                        request.machine)
        with self.stores.get() as store:
            revision = store.release_task(request.task, outcome, machine or None, result)
        return pb.ReportTaskResponse(revision=revision)


def limits_difference(cell: Mapping[str, SchedulerLimits],
                      mine: Mapping[str, SchedulerLimits]) -> str:
    """How a configuration's limits (``mine``) differ from the cell's, in words
    ("" if they do not)."""
    out = []
    for name in sorted(set(cell) | set(mine)):
        have, want = cell.get(name), mine.get(name)
        if have == want:
            continue
        if have is None:
            out.append(f"{name}: not one of the cell's schedulers, listed here")
        elif want is None:
            out.append(f"{name}: one of the cell's schedulers, not listed here")
        else:
            out.append(f"{name}: the cell's {_limits_text(have)}, here {_limits_text(want)}")
    return "; ".join(out)


def _limits_text(lim: SchedulerLimits) -> str:
    doc = {k: v for k, v in codec.limits_to_doc(lim).items() if v is not None and v != {}}
    return orjson.dumps(doc).decode() if doc else "no limits"


def _check_printable(doc: object, where: str) -> None:
    """No control character in any string of a JSON document (keys too): `omega why`
    and `omega job` print pending reports in terminals, where an escape sequence
    could rewrite what an operator sees."""
    if isinstance(doc, str):
        at = control_at(doc)
        if at >= 0:
            raise convert.WireError(f"{where}: control character {doc[at]!r} at position {at}")
    elif isinstance(doc, dict):
        for k, v in doc.items():
            _check_printable(k, f"{where} (a key)")
            _check_printable(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for n, v in enumerate(doc):
            _check_printable(v, f"{where}[{n}]")


def _task_result(request: pb.ReportTaskRequest) -> TaskResult:
    for name in ("started_at", "ended_at"):
        value = getattr(request, name)
        if not math.isfinite(value) or value < 0:
            raise convert.WireError(f"{name}: {value!r} is not a time (seconds since the "
                                    "epoch, or 0 for not known)")
    if request.ended_at and request.started_at > request.ended_at:
        raise convert.WireError(f"started_at {request.started_at} is after ended_at "
                                f"{request.ended_at}")
    if len(request.detail) > MAX_DETAIL:
        raise convert.WireError(f"detail: {len(request.detail)} characters, above the "
                                f"limit of {MAX_DETAIL}")
    at = control_at(request.detail)
    if at >= 0:
        # Shown by `omega job` in terminals: no escape sequences (agents clean theirs).
        raise convert.WireError(f"detail: control character {request.detail[at]!r} at "
                                f"position {at}")
    return TaskResult(request.exit_code if request.has_exit_code else None,
                      request.started_at, request.ended_at, request.detail)


def _add_tasks(info: pb.JobInfo, snap: CellSnapshot, job_id: str, task_count: int) -> None:
    """Every task of the job in index order. A task without a record is pending: only
    the recorded ones need reading (a million-task job is mostly unrecorded)."""
    tasks, add = snap.tasks, info.tasks.add
    for i in range(task_count):
        tid = f"{job_id}/{i}"
        if tid in tasks:
            v, rec = task_view(snap, tid), tasks[tid]
            add(index=i, state=v.state.value, machine=v.machine,
                has_exit_code=rec.exit_code is not None, exit_code=rec.exit_code or 0,
                started_at=rec.started_at, ended_at=rec.ended_at, detail=rec.detail,
                placed_at=rec.placed_at, scheduler=rec.scheduler)
        else:
            add(index=i, state="pending")


class Reaper:
    """Takes down the machines whose agent's lease lapsed, so their tasks go back to
    their schedulers. Every server replica runs one; the store's guarded write makes
    concurrent attempts harmless."""

    def __init__(self, kv: KV, cell: str, replica: Replica, interval: float = 1.0) -> None:
        self.store = CellStore(kv, cell)
        self.replica = replica
        self.interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
        replica.on_changes(self._changed)

    def _changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        # A machine is orphaned when its agent's key goes; anything else the periodic
        # pass catches (a scan of every machine per commit would cost more than it saves).
        if changed is None or any(k is KeyKind.AGENT for k, _ in changed):
            self._wake.set()

    def orphans(self, snap: CellSnapshot) -> list[str]:
        return sorted(
            m.id for m in snap.machines.values()
            if m.agent and m.agent not in snap.agents
            and (m.state is not MachineState.DOWN or m.allocations)
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            snap = self.replica.snapshot()
            down: dict[str, list[str]] = {}  # agent -> machines taken down now
            for mid in self.orphans(snap):
                try:
                    if self.store.machine_lost(mid):
                        down.setdefault(snap.machines[mid].agent, []).append(mid)
                except (StoreError, KVError) as e:
                    log.warning("taking machine %s down failed (%s); will retry", mid, e)
            for agent, mids in sorted(down.items()):
                # One line per agent, not per machine: an agent of 150 machines dies at once.
                log.warning("%d machine(s) down, their tasks lost: agent %s's lease lapsed "
                            "(%s)", len(mids), agent, _span(mids))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class CellStateServer:
    """One replica of the service: its etcd watch, cache, reaper and gRPC server."""

    def __init__(self, kv: KV, config: ServerConfig, *, clock: Callable[[], float] = time.time,
                 maintenance: MaintenancePolicy | None = None) -> None:
        self.kv = kv
        self.config = config
        self.replica = Replica(kv, config.cell)
        self.cache = WatchCache(self.replica)
        self.service = CellStateService(kv, config, self.replica, self.cache, clock)
        self.reaper = Reaper(kv, config.cell, self.replica)
        # Keeps etcd below its space quota and recovers from NOSPACE (etcd only).
        self.maintainer = (Maintainer(kv, config.name or config.listen, maintenance)
                           if isinstance(kv, EtcdKV) else None)
        self.service.maintainer = self.maintainer
        self.health = health.HealthServicer()
        opts = [("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.so_reuseport", 0)]
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=128,
                                                           thread_name_prefix="cellstate"),
                                options=opts, maximum_concurrent_rpcs=1000)
        pb_grpc.add_CellStateServicer_to_server(self.service, self.grpc)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        self.port = 0
        self.startup: dict[str, float] = {}
        self._stopped = threading.Event()

    def start(self) -> int:
        """Load the cell, settle what crashed committers left, then serve. Returns the
        port it listens on."""
        t0 = time.perf_counter()
        with self.service.stores.get() as store:
            if self.config.limits is not None:
                self._check_limits(store.seed_config(self.config.limits))
        t1 = time.perf_counter()
        self.replica.start()
        t2 = time.perf_counter()
        # Recovery reads the whole cell again: only when the replica's copy shows
        # something to settle (a start under load spent a tenth of its time on it).
        if CellStore.needs_recovery(self.replica.snapshot()):
            with self.service.stores.get() as store:
                settled = store.recover()
            log.info("settled %d gang(s) left by crashed committers", len(settled))
        t3 = time.perf_counter()
        self.reaper.start()
        if self.maintainer is not None:
            self.maintainer.start()
        if self.config.tls is not None:
            self.port = self.grpc.add_secure_port(self.config.listen,
                                                  server_credentials(self.config.tls))
        else:
            log.warning("cellstate %s serves PLAINTEXT gRPC on %s: no TLS, no identities, "
                        "every caller may do anything (--insecure)", self.config.name,
                        self.config.listen)
            self.port = self.grpc.add_insecure_port(self.config.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        self.grpc.start()
        if self.config.commit_leader:
            self._campaign()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        # Where a slow start goes (docs/reliability.md, "Restart time").
        self.startup = {"config_s": round(t1 - t0, 3), "load_s": round(t2 - t1, 3),
                        "recover_s": round(t3 - t2, 3),
                        "listen_s": round(time.perf_counter() - t3, 3)}
        log.info("cellstate %s serving cell %s at revision %d (start-up: %s)",
                 self.config.name, self.config.cell, self.replica.revision,
                 ", ".join(f"{k} {v:g}" for k, v in self.startup.items()))
        return self.port

    def _campaign(self) -> None:
        """Stand for commit leader (cellstate/api/leader.py); commits that reach this
        server meanwhile are forwarded to whoever leads."""
        svc = self.service
        svc.election = Election(self.kv, self.config.cell, self.advertised(),
                                ttl=self.config.leader_ttl, on_elected=svc.lead,
                                on_deposed=svc.step_down)
        svc.election.start()

    def advertised(self) -> str:
        """The address peers forward commits to: ``advertise``, else the listen
        address with the port bound (a wildcard host becomes this host's name)."""
        if self.config.advertise:
            return self.config.advertise
        host = self.config.listen.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = socket.gethostname()
        return f"{host}:{self.port}"

    def _check_limits(self, cell: CellConfig | None) -> None:
        """The cell's limits live in etcd, changed by operators (``omega limits``); a
        server's start-up file only seeds a cell that has none. A file that says
        otherwise than the cell is refused rather than written: the last server to
        start would otherwise decide every scheduler's limits (one without the table
        would lift them all)."""
        assert self.config.limits is not None
        if cell is None:
            log.info("cell %s: its limits are this server's configuration's (a new cell)",
                     self.config.cell)
            return
        diff = limits_difference(cell.limits, self.config.limits.limits)
        if diff:
            raise ConfigError(
                f"cell {self.config.cell}: the server's configuration disagrees with the "
                f"cell's limits in etcd ({diff}); not started, and the cell's limits are "
                "unchanged. The cell's limits are changed with `omega limits` (an "
                "operator); remove the [limits] tables from this server's configuration "
                "to serve what the cell says, or make them the same")

    def stop(self, grace: float | None = None) -> None:
        """Graceful: report NOT_SERVING, end every sync stream (clients resume on
        another replica), let unary calls in flight finish within the grace period."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.cache.close()
        if self.service.election is not None:
            self.service.election.stop()  # resigns: a follower leads at once
        self.grpc.stop(self.config.grace_seconds if grace is None else grace).wait()
        self.service.close_peers()
        self.reaper.stop()
        if self.maintainer is not None:
            self.maintainer.stop()
        self.replica.stop()

    def wait(self) -> None:
        self.grpc.wait_for_termination()

