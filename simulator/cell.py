"""The simulator's cell state: the store's semantics, kept in memory without a KV.

:class:`SimCell` is both the store the scheduler runtime commits to and the snapshot
source it reads. It decides nothing itself: every write is decided by the same pure
functions the real store uses (``validation.validate`` for claims, the judge in
``cellstate.decisions`` for the rest), and :meth:`SimCell._apply` applies the change to
immutable maps, so a snapshot stays O(1) and nothing is encoded. Each write advances the
revision by one and every record it writes takes that revision, exactly as etcd's
``mod_revision`` does for ``CellStore`` over ``MemoryKV`` (tests/simulator/
test_cell_equivalence.py drives random sequences of every write kind through both and
requires the same results and the same cell).

Per-scheduler limits (:meth:`SimCell.set_config`) keep a usage record per
resource-limited scheduler, as the store does: started in a write of their own right
after the configuration's, and updated in the same write as every change of what the
scheduler holds. Not modelled: gangs too large for one etcd transaction (here every
transaction is one write).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from cellstate import decisions
from cellstate.cell import CellSnapshot, machine_used
from cellstate.keys import KeyKind
from cellstate.model import (
    CellConfig,
    CommitResult,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    MachineState,
    Resources,
    SchedulerRecord,
    TaskRecord,
    TaskState,
    Transaction,
    UsageRecord,
    fallbacks_taken,
    labels_from,
    sum_resources,
    task_id,
)
from cellstate.records import RECORDS, with_revision
from cellstate.validation import Decision, check_batch, check_shape, validate_many

# Enum members as globals on hot paths (why: cellstate/validation.py).
_MACHINE = KeyKind.MACHINE
_TASK = KeyKind.TASK
_USAGE = KeyKind.USAGE

Changes = list[tuple[KeyKind, str]]
# The snapshot table each kind of record lives in.
_TABLES = {kind: r.table for kind, r in RECORDS.items()}
Listener = Callable[[CellSnapshot, Changes | None], None]


class SimCellError(ValueError):
    """A request the simulated store refuses (as the real store would)."""


class SimCell:
    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        # Virtual time, dating task records (placed_at, history) as a store's wall
        # clock does; the simulator gives its loop's.
        self.clock = clock
        self._snap = CellSnapshot.empty()
        self._listeners: list[Listener] = []
        self._leases = 0
        self.commits = 0
        # Resources each scheduler holds, kept as counters so that utilization and the
        # two-level allocator's dominant shares cost O(1) rather than a cell scan.
        self.usage: dict[str, Resources] = {}
        # Each machine's CPU in use over its CPU capacity, and how many machines are at
        # each such value, kept as machines are written: the load spread sampled over a
        # run then costs O(distinct values) instead of a scan of every machine.
        self._cpu_share: dict[str, float] = {}
        self._cpu_shares: dict[float, int] = {}  # a plain dict: a Counter's reads are slower
        self._tagged: set[str] = set()  # machines whose use depends on gang records
        # Machines written since the counts above were brought up to date, as written
        # last (None: removed): the counts are read only when sampled (every minute or
        # so), while a machine may be written several times in between.
        self._stale: dict[str, Machine | None] = {}
        # Schedulers with a resource limit: their usage records follow every change.
        self._limited: frozenset[str] = frozenset()

    # -- reading (the SnapshotSource side) -----------------------------------------------

    def snapshot(self) -> CellSnapshot:
        return self._snap

    @property
    def revision(self) -> int:
        return self._snap.revision

    def on_changes(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def off_changes(self, listener: Listener) -> None:
        """Stop announcing changes to ``listener`` (one given to :meth:`on_changes`):
        every listener is handed every change, so one whose reader is gone is work for
        nothing."""
        self._listeners.remove(listener)

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
        ds = validate_many(self._snap, txns, shape_checked=True, at=self.clock())
        if not any(d.accepted for d in ds):
            return [CommitResult((), d.rejected, self._snap.revision) for d in ds]
        accepted = [d for d in ds if d.accepted]
        # Each decision was made over the ones before it: one change, later records win.
        rev = (self._apply_decision(accepted[0]) if len(accepted) == 1
               else self._apply(_claims_writes(accepted), fresh=True))
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
        placed = [i for i in range(job.task_count) if task_id(job_id, i) in self._snap.tasks]
        return self._apply(decisions.resize_job(self._snap, job_id, task_count, placed))

    def set_job_status(self, status: JobStatus) -> int:
        change = decisions.set_job_status(self._snap, status)
        return self._apply(change) if change.writes else change.done_at

    def kill_job(self, status: JobStatus) -> int:
        """As ``CellStore.kill_job``: the status, then every running task killed."""
        revision = self.set_job_status(status)
        running = [t for i in range(self._job(status.job).task_count)
                   if (t := task_id(status.job, i)) in self._snap.tasks
                   and self._snap.tasks[t].state is TaskState.RUNNING]
        for tid in running:
            revision = self.release_task(tid, TaskState.KILLED)
        return revision

    # -- what agents and users do ----------------------------------------------------------

    def set_config(self, config: CellConfig) -> int:
        """Replace the cell's configuration (per-scheduler limits), as
        ``CellStore.set_config``: the configuration at one revision, then for each
        resource-limited scheduler a usage record counting from it (what the scheduler
        holds then), each in a write of its own. Returns the configuration's revision."""
        rev = self._snap.revision + 1
        config = attrs.evolve(config, revision=rev)
        self._publish(attrs.evolve(self._snap, revision=rev, config=config),
                      [(KeyKind.CONFIG, "")])
        self._limited = frozenset(s for s, lim in config.limits.items()
                                  if lim.max_resources is not None)
        for s in sorted(self._limited):
            at = self._snap.revision + 1
            held = self.usage.get(s, _NOTHING)
            record = UsageRecord(s, rev, held, at, base_used=held)
            self._publish(attrs.evolve(self._snap, revision=at,
                                       usage=self._snap.usage.set(s, record)),
                          [(_USAGE, s)])
        return rev

    def add_machines(self, machines: Iterable[Machine]) -> int:
        return self._apply(decisions.add_machines(self._snap, list(machines)))

    def update_machine(self, machine_id: str, *, capacity: Resources | None = None,
                       state: MachineState | None = None,
                       labels: Mapping[str, str] | None = None) -> int:
        return self._apply(decisions.update_machine(
            self._snap, machine_id, capacity=capacity, state=state,
            labels=labels_from(labels) if labels else None))

    def remove_machine(self, machine_id: str) -> int:
        m = self._snap.machines.get(machine_id)
        if m is not None and (m.state is not MachineState.DOWN or m.allocations):
            self.update_machine(machine_id, state=MachineState.DOWN)
        return self._apply(decisions.remove_machine(self._snap, machine_id))

    def submit_job(self, job: Job) -> int:
        return self._apply(decisions.submit_job(self._snap, job))

    def release_task(self, tid: str, outcome: TaskState, machine: str | None = None) -> int:
        """One task ended (as ``CellStore.release_task``: refused unless it runs)."""
        change = decisions.release_task(self._snap, tid, outcome, machine, at=self.clock())
        return self._apply(change) if change.writes else change.done_at

    def release_tasks(self, tids: Sequence[str], outcome: TaskState = TaskState.FINISHED,
                      placed_at: int | None = None) -> list[str]:
        """End running tasks (one write for all of them) and free their holds. Tasks
        that no longer run (preempted meanwhile) are skipped, and with ``placed_at``
        also tasks placed again since that revision; returns those released."""
        e = decisions.ended_tasks(self._snap, tids, outcome, placed_at, at=self.clock())
        if e.tasks:
            self._apply_end(e)
        return list(e.tasks)

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

    def _apply(self, change: decisions.Change, fresh: bool = False) -> int:
        """Write a decided change at the next revision (the guards of the real store
        always hold here: the change was decided on the current state). ``fresh``: the
        change's records were built by its decision and nothing else holds them (see
        :func:`_stamp`)."""
        snap = self._snap
        rev = snap.revision + 1
        tables: dict[str, Any] = {}
        stale = self._stale
        for (kind, ident), rec in change.writes.items():
            name = _TABLES[kind]
            table = tables.get(name)
            if table is None:
                table = tables[name] = getattr(snap, name).mutate()
            if rec is None:
                table.pop(ident, None)
            elif fresh:
                rec = table[ident] = _stamp(rec, rev)
            else:
                rec = table[ident] = with_revision(rec, rev)
            if kind is _MACHINE:
                stale[ident] = rec
        self._count_usage(change.added, change.removed)
        changes = list(change.writes)
        if self._limited:
            counted = self._usage_records(snap, change.added, change.removed, rev)
            if counted:
                table = tables.get("usage")
                if table is None:
                    table = tables["usage"] = snap.usage.mutate()
                table.update(counted)
                changes += [(_USAGE, s) for s in counted]
        self._publish(attrs.evolve(snap, revision=rev,
                                   **{n: t.finish() for n, t in tables.items()}),
                      changes)
        return rev

    def _apply_decision(self, d: Decision) -> int:
        """Write one accepted claims decision at the next revision: what
        ``_apply(_claims_writes([d]), fresh=True)`` writes, in the same order (its
        machines, then its tasks), without building the change first."""
        snap = self._snap
        rev = snap.revision + 1
        machines, tasks = snap.machines, snap.tasks
        # As _stamp, with the setters of the known record types (two per task placed).
        for m in d.machines.values():
            _set_seq(m, rev)
            _set_diff(m, None)
        for t in d.tasks.values():
            _set_revision(t, rev)
        if d.machines:
            machine_table = machines.mutate()
            machine_table.update(d.machines)
            machines = machine_table.finish()
            self._stale.update(d.machines)
        if d.tasks:
            task_table = tasks.mutate()
            task_table.update(d.tasks)
            tasks = task_table.finish()
        changes: Changes = [(_MACHINE, mid) for mid in d.machines]
        changes += [(_TASK, tid) for tid in d.tasks]
        self._count_usage(d.added, d.removed)
        usage = snap.usage
        if self._limited:
            counted = self._usage_records(snap, d.added, d.removed, rev)
            if counted:
                usage = usage.update(counted)
                changes += [(_USAGE, s) for s in counted]
        # Not attrs.evolve, which costs as much as the rest of a small commit.
        self._publish(CellSnapshot(rev, snap.config, machines, snap.jobs, tasks, snap.gangs,
                                   usage, snap.statuses, snap.instances, snap.schedulers,
                                   snap.agents), changes)
        return rev

    def _apply_end(self, e: decisions.Ended) -> int:
        """Write tasks that ended at the next revision: what ``_apply(end_tasks(...),
        fresh=True)`` writes, in the same order (the tasks, then their machines),
        without building the change first (a job's tasks end in one write)."""
        snap = self._snap
        rev = snap.revision + 1
        for t in e.tasks.values():
            _set_revision(t, rev)
        task_table = snap.tasks.mutate()
        task_table.update(e.tasks)
        machines = snap.machines
        if e.machines:
            for m in e.machines.values():
                _set_seq(m, rev)
                _set_diff(m, None)
            machine_table = machines.mutate()
            machine_table.update(e.machines)
            machines = machine_table.finish()
            self._stale.update(e.machines)
        changes: Changes = [(_TASK, tid) for tid in e.tasks]
        changes += [(_MACHINE, mid) for mid in e.machines]
        self._count_usage({}, e.removed)
        usage = snap.usage
        if self._limited:
            counted = self._usage_records(snap, {}, e.removed, rev)
            if counted:
                usage = usage.update(counted)
                changes += [(_USAGE, s) for s in counted]
        self._publish(CellSnapshot(rev, snap.config, machines, snap.jobs, task_table.finish(),
                                   snap.gangs, usage, snap.statuses, snap.instances,
                                   snap.schedulers, snap.agents), changes)
        return rev

    def _usage_records(self, snap: CellSnapshot, added: Mapping[str, Resources],
                       removed: Mapping[str, Resources], rev: int) -> dict[str, UsageRecord]:
        """The usage records of limited schedulers whose holdings the write moves, as the
        store counts them (the same sums, so the same numbers)."""
        out = {}
        for s in self._limited.intersection(added.keys() | removed.keys()):
            rec = snap.usage[s]
            assert isinstance(rec, UsageRecord)
            used = rec.used + added.get(s, _NOTHING) - removed.get(s, _NOTHING)
            out[s] = attrs.evolve(rec, used=used, revision=rev)
        return out

    def _count_usage(self, added: Mapping[str, Resources], removed: Mapping[str, Resources]
                     ) -> None:
        usage = self.usage
        for sched, res in added.items():
            usage[sched] = usage.get(sched, _NOTHING) + res
        for sched, res in removed.items():
            usage[sched] = usage.get(sched, _NOTHING) - res

    def _publish(self, snap: CellSnapshot, changes: Changes) -> None:
        self._snap = snap
        for listener in self._listeners:
            listener(snap, changes)

    def used(self, dimension: str) -> float:
        """What all schedulers hold of one resource dimension."""
        return sum(r.get(dimension) for r in self.usage.values())

    def cpu_share_counts(self) -> Mapping[float, int]:
        """How many machines (with CPUs) are at each value of CPU in use over CPU
        capacity, as ``machine_used`` reads them now."""
        self._count_shares()
        if not self._tagged:
            return self._cpu_shares
        # Staged gang holds count by their gangs' records: read every machine.
        snap = self._snap
        return Counter(machine_used(m, snap.gangs).get("cpu") / cap
                       for m in snap.machines.values() if (cap := m.capacity.get("cpu")) > 0)

    def _count_shares(self) -> None:
        """Bring the CPU share counts up to date with the machines written since."""
        share_of, counts, tagged = self._cpu_share, self._cpu_shares, self._tagged
        capacity, cap = None, 0.0  # machines share their capacity vector: read it once
        for mid, m in self._stale.items():
            share: float | None = None  # removed, or no CPUs
            if m is None:
                tagged.discard(mid)
            else:
                if m.has_tags:
                    tagged.add(mid)
                elif tagged:
                    tagged.discard(mid)
                if m.capacity is not capacity:
                    capacity = m.capacity
                    cap = capacity.get("cpu")
                if cap > 0:
                    used = m.settled_used.amounts  # sorted by name: cpu, if held, first
                    share = (used[0][1] if used and used[0][0] == "cpu"
                             else m.settled_used.get("cpu")) / cap
            old = share_of.get(mid)
            if old == share:
                continue  # written since, and back where it was: most machines
            if old is not None:
                left = counts[old] - 1
                if left:
                    counts[old] = left
                else:
                    del counts[old]
            if share is None:
                share_of.pop(mid, None)
            else:
                share_of[mid] = share
                counts[share] = counts.get(share, 0) + 1
        self._stale.clear()


def _claims_writes(ds: Sequence[Decision]) -> decisions.Change:
    """``decisions.merged([claims_change(d) for d in ds])`` without its reads, which
    only the real store's guards use (here the decision is applied to the state it was
    made on): the same writes in the same order, the same sums per scheduler."""
    writes: dict[decisions.Ref, object] = {}
    added: dict[str, Resources] = {}
    removed: dict[str, Resources] = {}
    for d in ds:
        writes.update(((_MACHINE, i), m) for i, m in d.machines.items())
        writes.update(((_TASK, i), t) for i, t in d.tasks.items())
        for into, more in ((added, d.added), (removed, d.removed)):
            for s, r in more.items():
                into[s] = into.get(s, _NOTHING) + r
    return decisions.Change(frozenset(), writes, added, removed)


_NOTHING = Resources()
_set_slot = object.__setattr__
_set_seq = Machine.__dict__["seq"].__set__
_set_diff = Machine.__dict__["diff"].__set__
_set_revision = TaskRecord.__dict__["revision"].__set__


def _stamp(record: Any, revision: int) -> Any:
    """A record a decision has just built, set in place to read as written at
    ``revision`` (``records.with_revision`` without the copy: the simulator writes two
    records per task placed and two per task ended, and copying each again was a
    tenth of its time). Only for records nobody else holds yet: the decision built
    them for this write, and they become visible only with the snapshot that has them."""
    if isinstance(record, Machine):
        _set_slot(record, "seq", revision)
        _set_slot(record, "diff", None)  # what it was built from may go now
    else:
        _set_slot(record, "revision", revision)
    return record


def capacity_of(snap: CellSnapshot) -> Resources:
    return sum_resources(m.capacity for m in snap.machines.values())

