"""The runtime every scheduler instance runs: queue, ownership, commit, retry, give-up.

One :class:`SchedulerInstance` is one instance of one scheduler (a policy under a
name). Its loop, one :meth:`~SchedulerInstance.step` at a time:

    take the due jobs it owns -> snapshot -> policy decides -> commit -> handle result

* **Queue.** Jobs name their scheduler; the queue of a scheduler is every live job
  naming it with tasks still to place, oldest submission first. It is derived from
  the replica's snapshot, so nothing is lost when an instance dies: the jobs are
  still in etcd.
* **Sharing.** Several instances of one scheduler split its queue by rendezvous
  hashing of job ids over the live instances (leased keys in etcd, Omega §4.3). When
  one joins or leaves, only the jobs whose winner changed move. While two instances
  briefly disagree, both may try a job; the store lets each task be placed once.
* **Retry.** An incremental transaction that committed part of a job leaves the rest
  pending; a gang that failed leaves all of it. The job is retried after a backoff
  (1 s, doubling while attempts place nothing, capped). ``retry_order`` says where
  it waits meanwhile: ``submission`` (its place by submission time: the oldest job
  first) or ``back`` (behind every job that arrived before its retry is due, as
  Omega's released simulator re-enqueues it).
* **Give up** after ``max_attempts`` attempts or ``max_fruitless_attempts`` attempts
  in a row that placed nothing (Omega's released simulator: 1,000 and 100), or at once
  when the policy says no state of the cell would let the job fit. ``fruitless_rule``
  says which fruitless attempts count: ``in-a-row`` (the default), ``from-start`` (only
  while none of the job's attempts has placed a task: the released simulator's) or
  ``off`` (none: the paper states only the 1,000 attempts). The reason is stored on
  the job (``JobStatus``).
* **Lease.** The instance's registration lives under a lease of ``lease_ttl``
  seconds. :meth:`~SchedulerInstance.run` renews it from a thread of its own, every
  ttl / 3 whatever the scheduling loop is doing (a long backoff, a slow decision, a
  commit waiting on a hung server); stepped instances renew it from their steps, and
  a step never asks to sleep past the next renewal.
* Clock, randomness and the store are injected, so the same instance runs threaded
  against etcd or stepped by the simulator on virtual time over the memory store.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from cellstate import admission
from cellstate.cell import CellSnapshot, task_state
from cellstate.errors import KVError, LeaseNotFoundError, StoreError, TransactionError
from cellstate.gc_tuning import RoundCollector
from cellstate.keys import KeyKind
from cellstate.model import (
    PLACEABLE,
    Claim,
    CommitResult,
    Detection,
    InstanceRecord,
    Job,
    JobState,
    JobStatus,
    Resources,
    TaskState,
    Transaction,
    TxnMode,
    printable,
    required_tasks,
    task_id,
)
from cellstate.replica import Replica
from cellstate.store import CellStore
from cellstate.validation import check_shape
from schedulers import limits
from schedulers.api import CellView, Context, Plan, Policy, Unplaced
from schedulers.metrics import SchedulerMetrics
from schedulers.why import PendingBook

# Enum members as globals on hot paths (why: cellstate/validation.py).
_MACHINE = KeyKind.MACHINE
_TASK = KeyKind.TASK

log = logging.getLogger(__name__)


class SnapshotSource(Protocol):
    """Where an instance reads the cell (a Replica)."""

    def snapshot(self) -> CellSnapshot: ...

    def on_changes(
        self, listener: Callable[[CellSnapshot, list[tuple[KeyKind, str]] | None], None]
    ) -> None: ...


class Committer(Protocol):
    """What an instance commits and registers through: a :class:`CellStore` (straight
    to etcd), the simulator's ``SimCell``, or, in a scheduler process, the cellstate
    service (``cellstate.api.client.RemoteStore``)."""

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """Commit a plan's transactions (one per job) in one call, answering each on
        its own, as if committed one after another; TransactionError if one is
        malformed (then nothing is applied)."""

    def register_instance(self, record: InstanceRecord, ttl: int) -> int: ...

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None: ...

    def keep_alive(self, lease: int) -> None:
        """Renew a lease: LeaseNotFoundError when it is gone, another KVError when the
        store cannot be reached (the lease may still be alive)."""

    def resize_job(self, job_id: str, task_count: int) -> int: ...

    def set_job_status(self, status: JobStatus) -> int: ...


RETRY_ORDERS = ("submission", "back")
FRUITLESS_RULES = ("in-a-row", "from-start", "off")


@attrs.frozen
class RuntimeConfig:
    mode: TxnMode = TxnMode.INCREMENTAL  # gang jobs always commit as gangs
    detection: Detection = Detection.FINE  # a job's own setting wins
    max_attempts: int = 1000
    max_fruitless_attempts: int = 100
    # Which attempts that placed nothing count toward max_fruitless_attempts (the
    # module's docstring).
    fruitless_rule: str = attrs.field(default="in-a-row",
                                      validator=attrs.validators.in_(FRUITLESS_RULES))
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    # "submission" or "back" (see the module's docstring).
    retry_order: str = attrs.field(default="submission",
                                   validator=attrs.validators.in_(RETRY_ORDERS))
    lease_ttl: int = 10
    idle_wait: float = 0.05
    # Jobs naming a scheduler that never ran in this cell are abandoned after this long.
    unknown_scheduler_grace: float = 30.0
    options: dict[str, Any] = attrs.field(factory=dict)  # handed to the policy's Context
    # Hand a policy that asks for them (Policy.absorbs_changes) the cell's changes while
    # no decision is due (Policy.absorb). Off by default: a simulator charges only
    # decisions, and would get the absorbed work for free.
    absorb_when_idle: bool = False


@attrs.frozen
class Attempt:
    """A decision made but not yet committed (see :meth:`SchedulerInstance.decide`)."""

    jobs: tuple[Job, ...]
    plan: Plan
    cost: float  # decision time to charge, from the ``decision_cost`` hook
    started_at: float
    snap: CellSnapshot
    now: float  # the time the policy was told (Context.now)


@attrs.define
class _JobState:
    first_attempt_at: float | None = None
    attempts: int = 0
    fruitless: int = 0
    placed_any: bool = False  # some attempt committed a task of the job
    next_try_at: float = 0.0
    requeued_at: float | None = None  # when a retry put it at the back of the queue
    # Held back by the scheduler's limits since its last attempt (reported once: a
    # held job is looked at again at every change of the scheduler's usage).
    held: bool = False


def follow_source(store: CellStore, source: SnapshotSource) -> None:
    """The setup only a local :class:`CellStore` needs: its working view learns what
    the instance's replica knows (and, from a Replica, every change it applies), so
    commits need fewer etcd reads and fail fewer guards."""
    if store.follows_snapshots:
        return
    if isinstance(source, Replica):
        store.follow(source)
    else:
        store.use_snapshots(source.snapshot)


def owner_of(job_id: str, instances: Sequence[str]) -> str | None:
    """Rendezvous hashing: the instance with the highest hash of (job, instance)."""
    best, best_score = None, b""
    for inst in instances:
        score = hashlib.blake2b(f"{job_id}\x00{inst}".encode(), digest_size=8).digest()
        if best is None or score > best_score:
            best, best_score = inst, score
    return best


class SchedulerInstance:
    def __init__(
        self,
        policy: Policy,
        store: Committer,
        source: SnapshotSource,
        *,
        scheduler: str | None = None,
        instance: str = "0",
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        config: RuntimeConfig | None = None,
        decision_cost: Callable[[Sequence[Job], Plan, float], float] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        pending: PendingBook | None = None,
    ) -> None:
        self.policy = policy
        self.store = store
        self.source = source
        self.scheduler = scheduler or policy.name
        self.instance = instance
        self.clock = clock
        self.rng = rng or random.Random(0)
        self.config = config or RuntimeConfig()
        # How much (virtual) time a decision costs: by default what it really took.
        self.decision_cost = decision_cost or (lambda jobs, plan, measured: measured)
        # What a decision is measured with: wall time, or (a simulator on a shared
        # machine) the process's CPU time, which other processes do not inflate.
        self.timer = timer
        self.metrics = SchedulerMetrics(self.scheduler, instance, clock())
        # Why each job this instance tried is still pending (None: nobody asks).
        self.pending = pending
        self._lock = threading.Lock()
        self._dirty: set[str] | None = None  # jobs to re-examine; None: all of them
        # Every change since the policy last decided (Context.changes); None: anything.
        self._seen: set[tuple[KeyKind, str]] | None = None
        self._queue: dict[str, tuple[float, str]] = {}  # job -> sort key
        # The queue's entries as a heap, to find the next job without sorting the
        # queue at every decision (a saturated scheduler's queue grows without bound);
        # entries no longer in _queue are stale and dropped when they reach the top.
        self._heap: list[tuple[float, str]] = []
        self._orphans: dict[str, float] = {}  # jobs of schedulers never seen -> submitted
        self._jobs: dict[str, _JobState] = {}
        self._inflight: list[tuple[int, Claim, Job]] = []  # committed, not yet in snapshot
        # Jobs the scheduler's limits hold back (schedulers/limits.py): due again when
        # its usage or the cell's limits change. A policy that divides its quota
        # itself (Policy.handles_limits) gets its jobs as they come.
        self._held: set[str] = set()
        self._limits_changed = False
        # (config revision, what the scheduler held) when jobs were last held back:
        # only a new configuration or less held can let one in.
        self._held_basis: tuple[int, Resources] | None = None
        self._limited = not policy.handles_limits
        # Set when a job arrives or ownership moves: run() stops waiting out another
        # job's backoff (up to max_retry_delay) and looks at the newcomer at once.
        self._wake = threading.Event()
        # Lease state; a renewal thread (run()) changes it too, so under _lease_lock,
        # which is held across the store calls so stop() cannot race a re-registration.
        self._lease_lock = threading.RLock()
        self._lease: int | None = None
        self._started = False  # between start() and stop(): keep a registration
        self._renewing = False  # a renewal thread keeps the lease, not the steps
        self._renew_at = 0.0  # when the lease is next due for renewal (or registration)
        self._next_propose = clock()
        self._members: tuple[str, ...] = ()
        self._all_members: tuple[str, ...] = ()
        # Machine ids, kept up to date from change events: listing a 10,000-entry HAMT
        # for every decision would cost more than the decision.
        self._machine_ids: list[str] = []
        self._machine_set: set[str] = set()
        self._machines_touched: set[str] | None = None
        # Every change wakes run(): the policy takes it in while nothing is due.
        self._absorbs = self.config.absorb_when_idle and policy.absorbs_changes
        # Whether the changes are kept for the policy (Context.changes) at all.
        self._tracks_changes = policy.reads_changes or policy.absorbs_changes
        if isinstance(store, CellStore):
            follow_source(store, source)
        source.on_changes(self._on_changes)

    # -- membership ------------------------------------------------------------------

    def start(self) -> None:
        """Announce this instance (a leased key), so it gets a share of the queue. If
        the store cannot be reached, the instance keeps trying (renewal thread or steps)."""
        with self._lease_lock:
            self._started = True
            record = InstanceRecord(self.scheduler, self.instance, self.policy.name,
                                    self.clock())
            self._lease = self.store.register_instance(record, self.config.lease_ttl)
            self._renew_at = self.clock() + self.config.lease_ttl / 3

    @property
    def lease(self) -> int | None:
        """The lease of this instance's registration (None before start)."""
        return self._lease

    def stop(self) -> None:
        """Withdraw at once; the other instances take over this one's jobs."""
        with self._lease_lock:
            self._started = False
            if self._lease is not None:
                lease, self._lease = self._lease, None
                self.store.deregister_instance(self.scheduler, self.instance, lease)
        with self._lock:
            # Keep no account of changes while stopped (the source still announces
            # them: a simulator's prefill instance would go over every change of the
            # run); started again, the instance reads the whole cell.
            self._dirty = self._machines_touched = self._seen = None

    def _keep_alive(self, now: float) -> None:
        """Renew the lease if a renewal is due, every ttl / 3 (register again if it is
        gone); after a failure, try again after ttl / 6 (at most 1 s)."""
        with self._lease_lock:
            if not self._started or now < self._renew_at:
                return
            retry_at = now + min(self.config.lease_ttl / 6, 1.0)
            if self._lease is None:
                if not self._register_again():
                    self._renew_at = retry_at
                return
            try:
                self.store.keep_alive(self._lease)
                self._renew_at = now + self.config.lease_ttl / 3
            except LeaseNotFoundError as e:
                log.warning("%s/%s: lease lost (%s); registering again",
                            self.scheduler, self.instance, e)
                self._lease = None
                if not self._register_again():
                    self._renew_at = retry_at
            except KVError as e:
                # Cannot tell (the store is unreachable): the lease may well be alive;
                # renew it again soon rather than take a second registration.
                log.warning("%s/%s: cannot renew the lease (%s); trying again",
                            self.scheduler, self.instance, e)
                self._renew_at = retry_at

    def _until_keep_alive(self, now: float) -> float:
        """Seconds until the steps must renew the lease (infinite when a renewal
        thread does it, or there is no registration to keep)."""
        if self._renewing or not self._started:
            return float("inf")
        return max(self._renew_at - now, 0.0)

    def _renew(self, done: threading.Event) -> None:
        """The renewal thread of :meth:`run`, independent of scheduling. Each attempt is
        bounded by the store's own deadlines (the gRPC client tries every server in
        turn within half the ttl), so one hung server never lets the lease lapse."""
        while True:
            with self._lease_lock:
                wait = self._renew_at - self.clock() if self._started else 1.0
            if done.wait(max(wait, 0.05)):
                return
            try:
                self._keep_alive(self.clock())
            except Exception:  # the thread must survive anything the store raises
                log.exception("%s/%s: lease renewal failed", self.scheduler, self.instance)
                with self._lease_lock:
                    self._renew_at = self.clock() + min(self.config.lease_ttl / 6, 1.0)

    def _register_again(self) -> bool:
        try:
            self.start()
        except (KVError, StoreError) as e:
            log.warning("%s/%s: cannot register (%s); trying again",
                        self.scheduler, self.instance, e)
            return False
        return True

    # -- the queue ---------------------------------------------------------------------

    def _on_changes(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        if changed is None:
            self._wake.set()
            self._limits_changed = True
            with self._lock:
                self._dirty = self._machines_touched = self._seen = None
            return
        # Every change of a commit is announced to every instance: what kinds of
        # record changed is found once, in C (a dict of the pairs keeps one per kind).
        kinds = dict(changed)
        if self._absorbs or not _WAKING.isdisjoint(kinds):
            self._wake.set()
        if KeyKind.CONFIG in kinds or (
                KeyKind.USAGE in kinds and (KeyKind.USAGE, self.scheduler) in changed):
            self._limits_changed = True
            # A new config (rare) always wakes: a decision under way may be about to
            # hold a job back, after which nothing else would wake it for this change.
            if self._held or KeyKind.CONFIG in kinds:
                self._wake.set()
        with self._lock:
            if self._seen is not None:
                self._seen.update(changed)
            if self._machines_touched is not None and _MACHINE in kinds:
                self._machines_touched.update(
                    [i for k, i in changed if k is _MACHINE])
            dirty = self._dirty
            if dirty is None:
                return
            if KeyKind.INSTANCE in kinds or KeyKind.SCHEDULER in kinds:
                self._dirty = None  # ownership may have moved
                return
            if not _DIRTYING.isdisjoint(kinds):
                # A job's own records, or a task's (its job is what the id says before
                # the last "/"), in the order they changed.
                dirty.update([i if k is not _TASK else i.rpartition("/")[0]
                              for k, i in changed if k in _DIRTYING])

    def _take_changes(self) -> tuple[set[str] | None, set[str] | None]:
        """What changed since the last step. Taken *before* the snapshot is read: a
        change is announced after the snapshot showing it is published, so the
        snapshot read next shows every change taken here."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            touched, self._machines_touched = self._machines_touched, set()
        return dirty, touched

    def _take_seen(self) -> frozenset[tuple[KeyKind, str]] | None:
        """The changes the policy has not been told of (taken before the snapshot is
        read, as in :meth:`_take_changes`); handed back by :meth:`_keep_seen` when no
        decision is made."""
        if not self._tracks_changes:
            return None
        with self._lock:
            seen, self._seen = self._seen, set()
        return frozenset(seen) if seen is not None else None

    def _keep_seen(self, seen: frozenset[tuple[KeyKind, str]] | None) -> None:
        with self._lock:
            if seen is None:
                self._seen = None
            elif self._seen is not None:
                self._seen.update(seen)

    def _refresh(self, snap: CellSnapshot, dirty: set[str] | None,
                 touched: set[str] | None) -> None:
        if touched is None:
            self._machine_ids = sorted(snap.machines.keys())
            self._machine_set = set(self._machine_ids)
        elif touched and (len(snap.machines) != len(self._machine_set)
                          or not self._machine_set.issuperset(touched)):
            # A machine came or went (one that only changed is in both, and each new
            # one was touched). Sorted: a map's order follows the string hash, which
            # differs from process to process, and a policy's random picks index this.
            self._machine_ids = sorted(snap.machines.keys())
            self._machine_set = set(self._machine_ids)
        members = tuple(snap.live_instances(self.scheduler))
        everyone = tuple(sorted(snap.instances))
        if dirty is None or members != self._members or everyone != self._all_members:
            self._members, self._all_members = members, everyone
            dirty = set(snap.jobs.keys())
            self._queue.clear()
            self._heap.clear()
            self._orphans.clear()
        for jid in dirty:
            self._examine(snap, jid)

    def _examine(self, snap: CellSnapshot, jid: str) -> None:
        job = snap.jobs.get(jid)
        old = self._queue.pop(jid, None)
        self._orphans.pop(jid, None)
        if job is None or jid in snap.statuses:
            self._jobs.pop(jid, None)
            return
        if job.scheduler != self.scheduler:
            if (job.scheduler not in snap.schedulers
                    and owner_of(jid, self._all_members) == f"{self.scheduler}/{self.instance}"):
                self._orphans[jid] = job.submitted_at
            return
        if owner_of(jid, self._members or (self.instance,)) != self.instance:
            self._jobs.pop(jid, None)
            return
        if _waiting(snap, job):
            st = self._jobs.get(jid)
            at = st.requeued_at if st is not None else None
            self._enqueue(jid, job.submitted_at if at is None else at, old)

    # -- metrics -------------------------------------------------------------------------

    def metrics_summary(self, now: float) -> dict[str, Any]:
        """The runtime's metrics (:meth:`SchedulerMetrics.summary`) and, under
        ``policy``, the policy's own (:meth:`Policy.report`): what a scheduler process
        reports. A report that raises or is not a small mapping of names to finite
        numbers is left out (and logged), never the runtime's part."""
        out = self.metrics.summary(now)
        try:
            report = self.policy.report()
        except Exception:  # a plugin's bug must not stop the instance's reports
            log.exception("%s/%s: policy %s: report() raised", self.scheduler, self.instance,
                          self.policy.name)
            return out
        if report:
            policy, bad = policy_report(report)
            if bad:
                log.warning("%s/%s: policy %s: report left out: %s", self.scheduler,
                            self.instance, self.policy.name, bad)
            else:
                out["policy"] = policy
        return out

    def still_waiting(self, snap: CellSnapshot, job_id: str) -> bool:
        """Whether ``job_id`` still has tasks for this instance to place in ``snap``
        (safe from any thread: reads only the snapshot)."""
        job = snap.jobs.get(job_id)
        if job is None or job_id in snap.statuses or job.scheduler != self.scheduler:
            return False
        members = snap.live_instances(self.scheduler) or [self.instance]
        return owner_of(job_id, members) == self.instance and _waiting(snap, job)

    def queue_depth(self) -> int:
        """How many jobs this instance has to place (safe from any thread)."""
        return len(self._queue)

    def queued(self) -> list[str]:
        """Job ids this instance will work on, in order."""
        return [j for _, j in sorted(self._queue.values())]

    def _enqueue(self, jid: str, key: float, old: tuple[float, str] | None) -> None:
        """Queue ``jid`` under ``key``; ``old`` is its entry before (still in the heap)."""
        entry = self._queue[jid] = (key, jid)
        if entry != old:
            heapq.heappush(self._heap, entry)
            if len(self._heap) > 2 * len(self._queue) + 64:
                self._heap = sorted(self._queue.values())  # a sorted list is a heap

    def _next_due(self, now: float) -> list[str]:
        """The first job in queue order whose retry is due (a list of it, or empty):
        ``[j for j in self.queued() if due(j)][:1]``, without sorting the queue when
        the queue's first job is due, as it is while jobs wait for the scheduler."""
        heap = self._heap
        while heap and self._queue.get(heap[0][1]) != heap[0]:
            heapq.heappop(heap)
        if heap and self._state(heap[0][1]).next_try_at <= now:
            return [heap[0][1]]
        return [j for j in self.queued() if self._state(j).next_try_at <= now][:1]

    # -- the loop ------------------------------------------------------------------------

    def step(self) -> float:
        """Do one unit of work; returns the seconds until there may be more."""
        attempt = self.decide()
        if isinstance(attempt, Attempt):
            self.finish(attempt)
            return 0.0
        return attempt

    def decide(self) -> Attempt | float:
        """The first half of :meth:`step`: take the due jobs, snapshot, ask the policy.
        Returns the attempt to hand to :meth:`finish`, or the seconds until there may
        be work. Split so that a simulator can let the decision take (virtual) time
        between snapshot and commit, as Omega's schedulers do."""
        now = self.clock()
        if not self._renewing:
            self._keep_alive(now)
        self._wake.clear()  # before taking the changes: a later one wakes run() again
        dirty, touched = self._take_changes()
        seen = self._take_seen()
        # Taken before the snapshot, as the changes are: the snapshot shows the change.
        limits_changed, self._limits_changed = self._limits_changed, False
        snap = self.source.snapshot()
        self._inflight = [x for x in self._inflight if x[0] > snap.revision]
        self._refresh(snap, dirty, touched)
        if limits_changed and self._held and self._room_may_have_grown(snap):
            self._release_held(now)
        self._reap_orphans(snap, now)
        if self.policy.propose_interval is not None and now >= self._next_propose:
            self._next_propose = now + self.policy.propose_interval
            return self._decide(snap, [], now, seen, propose=True)
        limited = self._limited and limits.binding(snap.config.limits_for(self.scheduler))
        pending = (limits.in_flight((c, j) for _, c, j in self._inflight)
                   if limited and self._inflight else None)
        if self.policy.batches_jobs() or self.policy.requeue_interval is not None:
            due = [j for j in self.queued() if self._state(j).next_try_at <= now]
            if limited:
                due = [j for j in due if not self._hold(snap, j, now, pending)]
        else:
            due = self._next_due(now)
            if limited and due and self._hold(snap, due[0], now, pending):
                # One pass in queue order to the first due job the limits let in.
                due = []
                for j in self.queued():
                    if self._state(j).next_try_at <= now and not self._hold(snap, j, now,
                                                                             pending):
                        due = [j]
                        break
        if not due:
            if not (self._absorbs and seen != frozenset() and self._absorb(snap, now, seen)):
                self._keep_seen(seen)
            waits = [self._state(j).next_try_at - now for j in self._queue]
            # An idle instance still wakes for its next proposal (a simulator's idle
            # wait is infinite: it would otherwise sleep until a job arrives).
            until_propose = (self._next_propose - now if self.policy.propose_interval
                             is not None else float("inf"))
            if not waits:
                return min(self.config.idle_wait, max(until_propose, 0.0))
            # A job's backoff (up to max_retry_delay) may be longer than the lease.
            return min(max(min(waits), 0.0), self._until_keep_alive(now),
                       max(until_propose, 0.0))
        if self.policy.requeue_interval is not None:
            # A policy with its own order (fair share) sees every waiting job in each
            # decision, not only those due: jobs that arrived between its rounds would
            # otherwise fall out of step and each round would order a different subset.
            due = self.queued()
        jobs = [snap.jobs[j] for j in (due if self.policy.batches_jobs() else due[:1])]
        return self._decide(snap, jobs, now, seen)

    def _hold(self, snap: CellSnapshot, jid: str, now: float,
              pending: Resources | None) -> bool:
        """Whether the scheduler's limits hold ``jid`` back now (see
        schedulers/limits.py): then it waits for a change of them or of the
        scheduler's usage (or ``max_retry_delay`` at most), its attempts not counted,
        or is abandoned when they never could take it. ``pending``: what this
        instance's commits in flight take."""
        job = snap.jobs[jid]
        blocker = admission.limit_blocker(snap, job, pending)
        if blocker is None:
            return False
        if blocker.permanent:
            self._abandon(job, blocker.text, now)
            return True
        st = self._state(jid)
        st.next_try_at = now + self.config.max_retry_delay
        self._held.add(jid)
        held = admission.held_by(snap, self.scheduler)
        self._held_basis = (snap.config.revision, held + pending if pending else held)
        if not st.held:
            st.held = True
            self.metrics.jobs_held += 1
            if self.pending is not None:
                self.pending.record(job, (Unplaced(jid, blocker.text, code="limit"),), None,
                                    st.attempts, now)
        return True

    def _room_may_have_grown(self, snap: CellSnapshot) -> bool:
        """Whether the limits may let a held job in now: a new configuration, or the
        scheduler holds less of some resource than when it held them back (its own
        placements landing, the usual change, let none in)."""
        basis = self._held_basis
        if basis is None or basis[0] != snap.config.revision:
            return True
        now_held = admission.held_by(snap, self.scheduler)
        return any(now_held.get(d) < amount for d, amount in basis[1].amounts)

    def _release_held(self, now: float) -> None:
        for jid in self._held:
            if jid in self._queue:
                self._state(jid).next_try_at = now
        self._held.clear()

    def _absorb(self, snap: CellSnapshot, now: float,
                seen: frozenset[tuple[KeyKind, str]] | None) -> bool:
        """Hand the policy the changes while no decision is due; whether it took them."""
        ctx = self._context(snap, now, seen)
        try:
            return self.policy.absorb(ctx)
        except BaseException:
            self._keep_seen(seen)  # not taken in: still owed to the next decision
            raise

    def _context(self, snap: CellSnapshot, now: float,
                 seen: frozenset[tuple[KeyKind, str]] | None) -> Context:
        """What the policy is handed: the snapshot with this instance's claims in flight."""
        view = CellView(snap, self.scheduler, [(c, j) for _, c, j in self._inflight],
                        self._machine_ids)
        return Context(view, now, self.rng, self.scheduler, self.instance, self.config.options,
                       seen, self.source.snapshot)

    def _state(self, jid: str) -> _JobState:
        st = self._jobs.get(jid)
        if st is None:
            st = self._jobs[jid] = _JobState()
        return st

    def _decide(self, snap: CellSnapshot, jobs: list[Job], now: float,
                seen: frozenset[tuple[KeyKind, str]] | None, propose: bool = False) -> Attempt:
        ctx = self._context(snap, now, seen)
        for job in jobs:
            st = self._state(job.id)
            if st.first_attempt_at is None:
                st.first_attempt_at = now
                self.metrics.record_wait(now - job.submitted_at)
        started = self.timer()
        if propose:
            plan = self.policy.propose(ctx)
        elif self.policy.batches_jobs():
            plan = self.policy.schedule_jobs(ctx, jobs)
        else:
            plan = self.policy.schedule_job(ctx, jobs[0])
        cost = self.decision_cost(jobs, plan, self.timer() - started)
        return Attempt(tuple(jobs), plan, cost, now, snap, ctx.now)

    def finish(self, attempt: Attempt) -> dict[str, CommitResult]:
        """The second half of :meth:`step`: commit the attempt's plan, record it, and
        queue, retry or abandon its jobs. Returns the commit result per job."""
        plan = attempt.plan
        for job_id, count in plan.resize.items():
            try:
                self.store.resize_job(job_id, count)
            except StoreError as e:
                log.warning("%s: resize of %s refused: %s", self.scheduler, job_id, e)
        if self._limited and limits.binding(attempt.snap.config.limits_for(self.scheduler)):
            plan = limits.trim(attempt.snap, self.scheduler, plan, attempt.snap.jobs,
                               limits.in_flight((c, j) for _, c, j in self._inflight))
        results = self._commit(attempt.snap, plan, attempt.now)
        self.metrics.record_decision([j.id for j in attempt.jobs], attempt.cost,
                                     list(results.values()))
        # Retries count from the end of the attempt (equal to its start when deciding
        # takes no virtual time).
        now = self.clock()
        # Before the reports go out: whoever reads one and raises the limit at once
        # must find the job waiting for that.
        self._wait_for_room(attempt.snap, plan)
        for job in attempt.jobs:
            self._after_attempt(job, plan, results.get(job.id), now)
            if self.pending is not None and job.id in self._queue:
                self.pending.record(job, plan.unplaced, results.get(job.id),
                                    self._state(job.id).attempts, now)
        return results

    def _wait_for_room(self, snap: CellSnapshot, plan: Plan) -> None:
        """Jobs whose tasks the limit kept out of this plan (``limits.trim``) wait, as
        held jobs do, for the limits to change or the scheduler to hold less: then they
        are tried at once, not after their retry delay (an operator who raises the
        limit expects the waiting tasks to start)."""
        trimmed = {u.job for u in plan.unplaced if u.code == "limit"}
        trimmed &= self._queue.keys()
        if not trimmed:
            return
        self._held.update(trimmed)
        # What it holds with this plan's commits, which the snapshot does not show yet:
        # its own placements landing must not count as room that grew.
        # (Every claim in flight is past ``snap``: decide() dropped the others.)
        held = admission.held_by(snap, self.scheduler) + limits.in_flight(
            (c, j) for _, c, j in self._inflight)
        self._held_basis = (snap.config.revision, held)

    def _commit(self, snap: CellSnapshot, plan: Plan, now: float) -> dict[str, CommitResult]:
        """Commit the plan as one transaction per job, all in one ``commit_many`` call
        (one round trip to the service, as few etcd transactions as fit)."""
        by_job: dict[str, list[Claim]] = {}
        for c in plan.claims:
            by_job.setdefault(c.job, []).append(c)
        txns: list[tuple[Job, Transaction]] = []
        for job_id, claims in by_job.items():
            job = snap.jobs.get(job_id)
            if job is None:
                continue
            if job.gang and len(claims) < len(CellView(snap, self.scheduler).pending_tasks(job)):
                continue  # a gang commits whole or not at all: no partial attempt
            txn = Transaction(
                self.scheduler,
                tuple(claims),
                TxnMode.GANG if job.gang else self.config.mode,
                job.detection or self.config.detection,
                job=job_id,
            )
            try:
                check_shape(txn)
            except TransactionError as e:
                # A policy bug must not take the instance down, nor the plan's other
                # jobs: this job's attempt counts as fruitless, the reason is logged.
                log.error("%s/%s: policy %s proposed an invalid transaction for job %s: %s",
                          self.scheduler, self.instance, self.policy.name, job_id, e)
                continue
            txns.append((job, txn))
        if not txns:
            return {}
        answers = self.store.commit_many([t for _, t in txns])
        results: dict[str, CommitResult] = {}
        for (job, _), res in zip(txns, answers, strict=True):
            results[job.id] = res
            self._log_outcome(job.id, res)
            # As applied: on the machine each claim took (a fallback, maybe).
            self._inflight.extend((res.revision, c, job) for c in res.committed)
        return results

    def _log_outcome(self, job_id: str, res: CommitResult) -> None:
        """The events an operator looks for in a scheduler's log: preemptions, and
        claims the store turned down (another scheduler got there first)."""
        if res.evicted:
            log.info("%s/%s: job %s preempted %d task(s): %s", self.scheduler, self.instance,
                     job_id, len(res.evicted), ", ".join(res.evicted[:5])
                     + (" ..." if len(res.evicted) > 5 else ""))
        if res.rejected:
            reasons = Counter(r.reason.value for r in res.rejected)
            log.info("%s/%s: job %s: %d of %d claim(s) conflicted (%s); will retry",
                     self.scheduler, self.instance, job_id, len(res.rejected),
                     len(res.rejected) + len(res.committed),
                     ", ".join(f"{n} {why}" for why, n in reasons.most_common()))

    def _fruitless_exhausted(self, st: _JobState) -> bool:
        rule = self.config.fruitless_rule
        if rule == "off" or (rule == "from-start" and st.placed_any):
            return False
        return st.fruitless >= self.config.max_fruitless_attempts

    def _after_attempt(self, job: Job, plan: Plan, res: CommitResult | None, now: float) -> None:
        st = self._state(job.id)
        st.attempts += 1
        st.held = False
        placed = len(res.committed) if res is not None else 0
        st.fruitless = 0 if placed else st.fruitless + 1
        st.placed_any = st.placed_any or placed > 0
        permanent = [u for u in plan.unplaced if u.job == job.id and u.permanent]
        if permanent:
            self._abandon(job, permanent[0].reason, now)
            return
        patient = self.policy.requeue_interval
        if patient is None and st.attempts >= self.config.max_attempts:
            self._abandon(job, f"gave up after {st.attempts} attempts"
                          + _why(plan.unplaced, job, res), now)
            return
        if patient is None and self._fruitless_exhausted(st):
            self._abandon(job, f"gave up after {st.fruitless} attempts in a row placed nothing"
                          + _why(plan.unplaced, job, res), now)
            return
        done = res is not None and not res.rejected and not any(
            u.job == job.id for u in plan.unplaced)
        if done:
            # Off the queue until its task records change (the replica re-examines it).
            self._queue.pop(job.id, None)
        elif patient is not None:
            st.next_try_at = now + patient
        else:
            delay = self.config.retry_delay * (2 ** min(st.fruitless, 5) if not placed else 1)
            st.next_try_at = now + min(delay, self.config.max_retry_delay)
            if self.config.retry_order == "back":
                # It re-enters the queue when its retry is due, behind every job there.
                st.requeued_at = st.next_try_at
                if job.id in self._queue:
                    self._enqueue(job.id, st.requeued_at, self._queue[job.id])

    def _abandon(self, job: Job, reason: str, now: float) -> None:
        self.metrics.jobs_abandoned += 1
        self._queue.pop(job.id, None)
        try:
            self.store.set_job_status(JobStatus(job.id, JobState.ABANDONED,
                                                printable(reason),
                                                f"{self.scheduler}/{self.instance}", now))
        except StoreError as e:
            log.warning("%s: could not record abandoning %s: %s", self.scheduler, job.id, e)

    def _reap_orphans(self, snap: CellSnapshot, now: float) -> None:
        for jid, submitted in list(self._orphans.items()):
            if now - submitted < self.config.unknown_scheduler_grace:
                continue
            job = snap.jobs.get(jid)
            self._orphans.pop(jid)
            if job is None or jid in snap.statuses or job.scheduler in snap.schedulers:
                continue
            known = ", ".join(sorted(snap.schedulers)) or "none"
            self._abandon(job, f"no scheduler named {job.scheduler!r} runs in this cell "
                               f"(known: {known})", now)

    # -- threaded driver -----------------------------------------------------------------

    def run(self, stop: threading.Event, collector: RoundCollector | None = None) -> None:
        """Step until ``stop`` is set (for processes and threaded tests), renewing the
        lease from a thread of its own meanwhile. With a ``collector`` (a scheduler
        process's), garbage is collected between steps, never inside a decision."""
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(done,), daemon=True,
                                   name=f"lease-{self.scheduler}-{self.instance}")
        self._renewing = True
        renewer.start()
        try:
            while not stop.is_set():
                try:
                    delay = self.step()
                except (KVError, StoreError) as e:
                    log.warning("%s/%s: step failed: %s", self.scheduler, self.instance, e)
                    delay = self.config.retry_delay
                except Exception:  # a plugin's bug: keep the instance (and its lease) alive
                    log.exception("%s/%s: step raised", self.scheduler, self.instance)
                    delay = self.config.retry_delay
                if collector is not None:
                    collector.between(idle=delay > 0)
                if delay > 0:
                    self._sleep(delay, stop)
        finally:
            done.set()
            renewer.join(timeout=10)
            self._renewing = False


    def _sleep(self, delay: float, stop: threading.Event) -> None:
        """Wait ``delay`` seconds, less if ``stop`` is set or a job arrives."""
        deadline = time.monotonic() + delay
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wake.wait(min(left, 0.2)):
                return


# Changes that may give an instance new work at once (a new job, a job's status,
# instances joining or leaving).
_WAKING = frozenset({KeyKind.JOB, KeyKind.INSTANCE, KeyKind.SCHEDULER})
# Changes that may change which jobs wait: a job's records and its tasks'.
_DIRTYING = frozenset({KeyKind.JOB, KeyKind.STATUS, KeyKind.TASK})

#: At most this many numbers in a policy's report: a scheduler's whole metrics report
#: must stay small (the cellstate service refuses one over 16 KiB).
MAX_POLICY_REPORT = 64


def policy_report(report: object) -> tuple[dict[str, float | int], str]:
    """A policy's report as reported (a plain dict), or why it cannot be: names must
    be short strings and values finite numbers (a bool is no number here)."""
    if not isinstance(report, Mapping):
        return {}, f"expected a mapping, got {type(report).__name__}"
    if len(report) > MAX_POLICY_REPORT:
        return {}, f"{len(report)} entries, above the limit of {MAX_POLICY_REPORT}"
    out: dict[str, float | int] = {}
    for key, value in report.items():
        if not isinstance(key, str) or not 0 < len(key) <= 64:
            return {}, f"name {key!r} is not a string of 1 to 64 characters"
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            return {}, f"{key}: {value!r} is not a finite number"
        out[key] = value
    return out, ""


def _waiting(snap: CellSnapshot, job: Job) -> bool:
    """Whether a task the job's scheduler must place is waiting: any of its tasks, but
    only the requested workers of a MapReduce job (its extra workers are the elastic
    policy's to place), and none once one of its workers finished (the job's work is
    done: its workers end together)."""
    if job.mapreduce is None:
        return any(task_state(snap, task_id(job.id, i)) in PLACEABLE
                   for i in range(job.task_count))
    states = [task_state(snap, task_id(job.id, i)) for i in range(job.task_count)]
    if TaskState.FINISHED in states:
        return False
    return any(s in PLACEABLE for s in states[:required_tasks(job)])


def _why(unplaced: Iterable[Unplaced], job: Job, res: CommitResult | None) -> str:
    for u in unplaced:
        if u.job == job.id:
            return f"; last reason: {u.reason}"
    if res is not None and res.rejected:
        r = res.rejected[0]
        return f"; last conflict: {r.reason.value}: {r.detail}"
    return ""
