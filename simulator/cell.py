"""The simulator's cell state: the store's semantics, kept in memory without a KV.

:class:`SimCell` is both the store the scheduler runtime commits to and the snapshot
source it reads. A commit runs the very ``validate()`` the real store runs, then
applies the decision to immutable maps, so a snapshot stays O(1) and nothing is
encoded. Each write advances the revision by one and every machine it rewrites takes
that revision as its sequence number, exactly as etcd's ``mod_revision`` does for
``CellStore`` over ``MemoryKV`` (tests/simulator/test_cell_equivalence.py checks that
both give the same commit results on the same transactions).

Not modelled: per-scheduler resource limits (usage records) and gangs too large for
one etcd transaction (here every transaction is one write).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from cellstate.cell import CellSnapshot
from cellstate.keys import KeyKind
from cellstate.model import (
    Allocation,
    CommitResult,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    Resources,
    SchedulerRecord,
    TaskRecord,
    TaskState,
    Transaction,
    fallbacks_taken,
    sum_resources,
    task_id,
)
from cellstate.validation import check_batch, check_shape, validate_many

Changes = list[tuple[KeyKind, str]]
Listener = Callable[[CellSnapshot, Changes | None], None]


class SimCellError(ValueError):
    """A request the simulated store refuses (as the real store would)."""


class SimCell:
    def __init__(self) -> None:
        self._snap = CellSnapshot.empty()
        self._listeners: list[Listener] = []
        self._leases = 0
        self.commits = 0
        # Resources each scheduler holds, kept as counters so that utilization and the
        # two-level allocator's dominant shares cost O(1) rather than a cell scan.
        self.usage: dict[str, Resources] = {}

    # -- reading (the SnapshotSource side) -----------------------------------------------

    def snapshot(self) -> CellSnapshot:
        return self._snap

    @property
    def revision(self) -> int:
        return self._snap.revision

    def on_changes(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- the Committer side (schedulers.runtime) ---------------------------------------------
    # Commits always see the current state: there is no working view to set up.

    def commit(self, txn: Transaction) -> CommitResult:
        """Validate against the current state and apply what was accepted."""
        check_shape(txn)
        return self._commit([txn])[0]

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """Several transactions, decided in order as ``CellStore.commit_many`` decides
        them, applied in one write."""
        check_batch(txns)
        return self._commit(list(txns))

    def _commit(self, txns: list[Transaction]) -> list[CommitResult]:
        self.commits += 1
        ds = validate_many(self._snap, txns, shape_checked=True)
        if not any(d.accepted for d in ds):
            return [CommitResult((), d.rejected, self._snap.revision) for d in ds]
        rev = self._snap.revision + 1
        machines = self._snap.machines.mutate()
        tasks = self._snap.tasks.mutate()
        # Dicts, not sets: the order of change events must not depend on hash seeds.
        changed_machines: dict[str, None] = {}
        changed_tasks: dict[str, None] = {}
        for d in ds:  # each decision was made over the ones before: later records win
            for mid, m in d.machines.items():
                machines[mid] = m.with_seq(rev)
            for tid, rec in d.tasks.items():
                # Not attrs.evolve: this runs once per placed task and evolve is 5x slower.
                tasks[tid] = TaskRecord(rec.job, rec.index, rec.state, rec.machine,
                                        rec.scheduler, rec.gang, rev)
            for sched, res in d.added.items():
                self.usage[sched] = self.usage.get(sched, Resources()) + res
            for sched, res in d.removed.items():
                self.usage[sched] = self.usage.get(sched, Resources()) - res
            changed_machines.update(dict.fromkeys(d.machines))
            changed_tasks.update(dict.fromkeys(d.tasks))
        changes: Changes = [(KeyKind.MACHINE, mid) for mid in changed_machines]
        changes.extend((KeyKind.TASK, tid) for tid in changed_tasks)
        self._publish(attrs.evolve(self._snap, revision=rev, machines=machines.finish(),
                                   tasks=tasks.finish()), changes)
        return [CommitResult(d.accepted, d.rejected, rev, d.evicted,
                             fell_back=fallbacks_taken(t.claims, d.accepted))
                for t, d in zip(txns, ds, strict=True)]

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        if record.id in self._snap.instances:
            raise SimCellError(f"instance {record.id} is already running")
        self._leases += 1
        rev = self._snap.revision + 1
        snap = attrs.evolve(
            self._snap, revision=rev,
            instances=self._snap.instances.set(record.id, attrs.evolve(record, revision=rev)),
            schedulers=self._snap.schedulers.set(
                record.scheduler, SchedulerRecord(record.scheduler, record.policy, rev)))
        self._publish(snap, [(KeyKind.INSTANCE, record.id), (KeyKind.SCHEDULER, record.scheduler)])
        return self._leases

    def keep_alive(self, lease: int) -> None:
        """Leases never lapse on virtual time; keep-alives are accepted and ignored."""

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None:
        key = f"{scheduler}/{instance}"
        if key in self._snap.instances:
            self._publish(attrs.evolve(self._snap, revision=self._snap.revision + 1,
                                       instances=self._snap.instances.delete(key)),
                          [(KeyKind.INSTANCE, key)])

    def resize_job(self, job_id: str, task_count: int) -> int:
        job = self._job(job_id)
        return self._put_job(attrs.evolve(job, task_count=task_count))

    def set_job_status(self, status: JobStatus) -> int:
        self._job(status.job)
        rev = self._snap.revision + 1
        self._publish(attrs.evolve(self._snap, revision=rev, statuses=self._snap.statuses.set(
            status.job, attrs.evolve(status, revision=rev))), [(KeyKind.STATUS, status.job)])
        return rev

    # -- what agents and users do ----------------------------------------------------------

    def add_machines(self, machines: Iterable[Machine]) -> int:
        rev = self._snap.revision + 1
        table = self._snap.machines.mutate()
        changes: Changes = []
        for m in machines:
            if m.id in table:
                raise SimCellError(f"machine {m.id!r} exists already")
            table[m.id] = m.with_seq(rev)
            changes.append((KeyKind.MACHINE, m.id))
        self._publish(attrs.evolve(self._snap, revision=rev, machines=table.finish()), changes)
        return rev

    def submit_job(self, job: Job) -> int:
        if job.id in self._snap.jobs:
            raise SimCellError(f"job {job.id!r} exists already")
        return self._put_job(job)

    def release_tasks(self, tids: Sequence[str], outcome: TaskState = TaskState.FINISHED,
                      placed_at: int | None = None) -> list[str]:
        """End running tasks (one write for all of them) and free their holds. Tasks
        that no longer run (preempted meanwhile) are skipped, and with ``placed_at``
        also tasks placed again since that revision; returns those released."""
        snap = self._snap
        by_machine: dict[str, list[str]] = {}
        records: list[TaskRecord] = []
        for tid in tids:
            rec = snap.tasks.get(tid)
            if rec is None or rec.state is not TaskState.RUNNING:
                continue
            if placed_at is not None and rec.revision != placed_at:
                continue  # a later placement of the task: its own end event frees it
            by_machine.setdefault(rec.machine, []).append(tid)
            records.append(rec)
        if not records:
            return []
        rev = snap.revision + 1
        machines = snap.machines.mutate()
        for mid, gone in by_machine.items():
            m = snap.machines[mid]
            ending = [m.allocations[t] for t in gone]
            for a in ending:
                self.usage[a.scheduler] = self.usage.get(a.scheduler, Resources()) - a.resources
            drop = set(gone)
            allocs = {t: a for t, a in m.allocations.items() if t not in drop}
            machines[mid] = _rewritten(m, allocs, rev,
                                       m.settled_used - sum_resources(a.resources for a in ending))
        tasks = snap.tasks.mutate()
        for rec in records:
            tasks[rec.id] = TaskRecord(rec.job, rec.index, outcome, rec.machine, rec.scheduler,
                                       revision=rev)
        changes: Changes = [(KeyKind.MACHINE, mid) for mid in by_machine]
        changes.extend((KeyKind.TASK, rec.id) for rec in records)
        self._publish(attrs.evolve(snap, revision=rev, machines=machines.finish(),
                                   tasks=tasks.finish()), changes)
        return [rec.id for rec in records]

    def forget_job(self, job_id: str) -> None:
        """Drop a job that is over (its tasks ended, or it was abandoned with none
        running) and its records, as a cell's garbage collector would: a week-long run
        would otherwise hold millions of finished task records."""
        job = self._job(job_id)
        tasks = self._snap.tasks.mutate()
        for i in range(job.task_count):
            tasks.pop(task_id(job_id, i), None)
        statuses = self._snap.statuses
        if job_id in statuses:
            statuses = statuses.delete(job_id)
        self._publish(attrs.evolve(self._snap, revision=self._snap.revision + 1,
                                   jobs=self._snap.jobs.delete(job_id), tasks=tasks.finish(),
                                   statuses=statuses),
                      [(KeyKind.JOB, job_id), (KeyKind.STATUS, job_id)])

    # -- internals ---------------------------------------------------------------------------

    def _job(self, job_id: str) -> Job:
        job = self._snap.jobs.get(job_id)
        if job is None:
            raise SimCellError(f"unknown job {job_id!r}")
        return job

    def _put_job(self, job: Job) -> int:
        rev = self._snap.revision + 1
        self._publish(attrs.evolve(self._snap, revision=rev, jobs=self._snap.jobs.set(
            job.id, attrs.evolve(job, revision=rev))), [(KeyKind.JOB, job.id)])
        return rev

    def _publish(self, snap: CellSnapshot, changes: Changes) -> None:
        self._snap = snap
        for listener in self._listeners:
            listener(snap, changes)


    def used(self, dimension: str) -> float:
        """What all schedulers hold of one resource dimension."""
        return sum(r.get(dimension) for r in self.usage.values())


def _rewritten(m: Machine, allocations: dict[str, Allocation], seq: int,
               settled_used: Resources) -> Machine:
    """``m`` with other allocations at a new sequence number, built once (not via
    with_allocations then with_seq: machines are rebuilt for every task that ends)."""
    out = Machine(m.id, m.capacity, m.rack, m.failure_domain, m.labels, m.state, m.agent,
                  allocations, seq)
    object.__setattr__(out, "settled_used", settled_used)  # the cached sum, known already
    return out


def capacity_of(snap: CellSnapshot) -> Resources:
    return sum_resources(m.capacity for m in snap.machines.values())

