"""What users ask about jobs and the cell: job states, task counts, cell totals.

Two ways to the same answers. :func:`job_summary` and :func:`cell_totals` read every
task of a snapshot (O(tasks): seconds for a million-task job), and stay as the plain
statement of what the answers are. :class:`StatusIndex` follows a replica's change sets
and keeps per-job task-state counts and the machines' totals up to date, so a server
answers status questions in O(jobs) (tests check that both ways agree).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import immutables

from cellstate.cell import CellSnapshot, machine_used, task_view
from cellstate.keys import KeyKind
from cellstate.model import (
    PLACEABLE,
    Allocation,
    Job,
    JobStatus,
    Machine,
    MachineState,
    Resources,
    TaskState,
)


@attrs.frozen
class JobSummary:
    job: Job
    state: str  # pending, running, finished, failed, abandoned, killed
    reason: str
    task_states: dict[str, int]


def _summary(job: Job, status: JobStatus | None, counts: Mapping[TaskState, int]) -> JobSummary:
    """The job's state from the states of all its tasks (``counts`` covers every task)."""
    states = {s.value: n for s, n in sorted(counts.items(), key=lambda kv: kv[0].value) if n}
    if status is not None:
        return JobSummary(job, status.state.value, status.reason, states)
    if counts.get(TaskState.FINISHED, 0) == job.task_count or (
            # A MapReduce job's workers end together when its work is done; extra
            # workers evicted before then are not waited for.
            job.mapreduce is not None and counts.get(TaskState.FINISHED, 0)
            and not counts.get(TaskState.RUNNING, 0)):
        state = "finished"
    elif counts.get(TaskState.FAILED, 0) and not counts.get(TaskState.RUNNING, 0) and not any(
        counts.get(s, 0) for s in PLACEABLE
    ):
        state = "failed"  # failed tasks are not retried: nothing more will happen
    elif counts.get(TaskState.RUNNING, 0) or counts.get(TaskState.FINISHED, 0):
        state = "running"
    else:
        state = "pending"
    return JobSummary(job, state, "", states)


def job_summary(snap: CellSnapshot, job: Job) -> JobSummary:
    """The job as users see it, read task by task (O(the job's tasks))."""
    counts = Counter(task_view(snap, f"{job.id}/{i}").state for i in range(job.task_count))
    return _summary(job, snap.statuses.get(job.id), counts)


@attrs.frozen
class MachineTotals:
    """Machines up (not down) and down; capacity and use of those up."""

    up: int = 0
    down: int = 0
    capacity: Resources = attrs.field(factory=Resources)
    used: Resources = attrs.field(factory=Resources)


def machine_totals(snap: CellSnapshot) -> MachineTotals:
    up = [m for m in snap.machines.values() if m.state is not MachineState.DOWN]
    capacity = Resources()
    used = Resources()
    for m in up:
        capacity = capacity + m.capacity
        used = used + machine_used(m, snap.gangs)
    return MachineTotals(len(up), len(snap.machines) - len(up), capacity, used)


def _totals(snap: CellSnapshot, machines: MachineTotals,
            summaries: Iterable[JobSummary]) -> dict[str, Any]:
    jobs: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    for s in summaries:
        jobs[s.state] += 1
        tasks.update(s.task_states)
    return {
        "revision": snap.revision,
        "machines_up": machines.up,
        "machines_down": machines.down,
        "capacity": machines.capacity.as_dict(),
        "used": machines.used.as_dict(),
        "jobs": dict(sorted(jobs.items())),
        "tasks": dict(sorted(tasks.items())),
        "agents": len(snap.agents),
    }


def cell_totals(snap: CellSnapshot) -> dict[str, Any]:
    """Machines up and down, capacity and use of the machines that are up, jobs and
    tasks by state, read record by record (O(machines + tasks))."""
    return _totals(snap, machine_totals(snap), (job_summary(snap, j) for j in snap.jobs.values()))


# Per job: how many of its tasks that have a record are in each state (as task_view
# reads them). Tasks without a record are pending and not counted: a job's pending
# tasks are its task count minus its recorded tasks plus those that read as pending.
JobCounts = Mapping[TaskState, int]


@attrs.frozen
class StatusView:
    """The answers at one revision: a snapshot and the counts kept for it."""

    snap: CellSnapshot
    counts: immutables.Map[str, JobCounts]
    machines: MachineTotals

    def job(self, job: Job) -> JobSummary:
        """As :func:`job_summary`, in O(1)."""
        recorded = self.counts.get(job.id, {})
        counts = dict(recorded)
        counts[TaskState.PENDING] = counts.get(TaskState.PENDING, 0) + max(
            job.task_count - sum(recorded.values()), 0)
        return _summary(job, self.snap.statuses.get(job.id), counts)

    def totals(self) -> dict[str, Any]:
        """As :func:`cell_totals`, in O(jobs)."""
        return _totals(self.snap, self.machines, (self.job(j) for j in self.snap.jobs.values()))


class StatusIndex:
    """Per-job task-state counts and machine totals kept from a replica's change sets.

    The counts follow the replica's batches when read (``view``), at a cost of O(the
    records changed since the last read), as if followed batch by batch: a task's
    state as users see it depends on its own record, its gang's record, and (for a
    gang's evictions) its allocation on its machine, so a changed gang record re-reads
    only the tasks and machines that name that gang (kept in two small indexes).
    Create it before the replica starts; it rebuilds itself in O(records) on every
    (re)load, as the replica applies it."""

    def __init__(self, replica: Any) -> None:
        self._lock = threading.Lock()
        self._advanced = threading.Condition(self._lock)
        self._prev = CellSnapshot.empty()
        self._counts: immutables.Map[str, JobCounts] = immutables.Map()
        self._gang_tasks: dict[str, set[str]] = {}  # gang -> task records tagged with it
        self._gang_machines: dict[str, set[str]] = {}  # gang -> machines with its tags
        self._capacity: dict[str, float] = {}
        self._used: dict[str, float] = {}
        self._up = 0
        self._view = StatusView(self._prev, self._counts, MachineTotals())
        # What the replica changed since the counts were brought up to date: they are
        # brought up to date when read (status calls, metrics), not on the replica's
        # thread for every batch. A busy cell's commits rewrite the same machines again
        # and again between two reads; followed batch by batch the counts cost the
        # commit leader's server about a tenth of its CPU (service_throughput.py).
        self._latest = self._prev
        self._pending: set[tuple[KeyKind, str]] = set()
        replica.on_changes(self._changed)
        self._changed(replica.snapshot(), None)

    def view(self) -> StatusView:
        with self._lock:
            self._settle()
            return self._view

    def view_at(self, revision: int, timeout: float) -> StatusView | None:
        """The answers once they cover ``revision``, or None if they do not within
        ``timeout`` seconds. (Waiting on the replica is not enough: its snapshot is
        published before these counts follow it.)"""
        deadline = time.monotonic() + timeout
        with self._advanced:
            while self._latest.revision < revision:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._advanced.wait(left)
            self._settle()
            return self._view

    # -- following the replica -----------------------------------------------------------

    def _changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        with self._lock:
            if changed is None:
                # A (re)load: counted again from the whole snapshot, here (rare), so
                # that a status call never pays for a rebuild.
                self._pending.clear()
                self._rebuild(snap)
                self._publish(snap)
            elif changed:
                self._pending.update(changed)
            self._latest = snap
            self._advanced.notify_all()

    def _settle(self) -> None:
        """Bring the counts up to the replica's latest snapshot. Under the lock."""
        snap = self._latest
        if snap is self._view.snap:
            return
        if self._pending:
            self._apply(snap, list(self._pending))
            self._pending.clear()
        self._publish(snap)

    def _publish(self, snap: CellSnapshot) -> None:
        self._prev = snap
        self._view = StatusView(snap, self._counts, self._machine_totals(len(snap.machines)))

    def _rebuild(self, snap: CellSnapshot) -> None:
        self._gang_tasks.clear()
        self._gang_machines.clear()
        self._capacity.clear()
        self._used.clear()
        self._up = 0
        counts: dict[str, Counter[TaskState]] = {}
        for tid, rec in snap.tasks.items():
            counts.setdefault(rec.job, Counter())[task_view(snap, tid).state] += 1
            if rec.gang:
                self._gang_tasks.setdefault(rec.gang, set()).add(tid)
        self._counts = immutables.Map((j, dict(c)) for j, c in counts.items())
        for m in snap.machines.values():
            self._machine_in(m, snap)

    def _apply(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]]) -> None:
        prev = self._prev
        tasks: set[str] = set()
        machines: set[str] = set()
        gangs: set[str] = set()
        for kind, ident in changed:
            if kind is KeyKind.TASK:
                tasks.add(ident)
            elif kind is KeyKind.MACHINE:
                machines.add(ident)
            elif kind is KeyKind.GANG:
                gangs.add(ident)
        for g in gangs:
            # Before the indexes move: tasks and machines that named it until now.
            tasks.update(self._gang_tasks.get(g, ()))
            machines.update(self._gang_machines.get(g, ()))
        for mid in machines:
            for m in (prev.machines.get(mid), snap.machines.get(mid)):
                if m is not None and m.has_tags:
                    tasks.update(t for t, a in m.allocations.items() if a.evicted_by)
        for tid in tasks:
            self._retag_task(tid, prev, snap)
        for mid in machines:
            self._machine_changed(prev.machines.get(mid), prev, snap.machines.get(mid), snap)
        deltas: dict[str, Counter[TaskState]] = {}
        for tid in tasks:
            self._count(deltas, tid, prev, -1)
            self._count(deltas, tid, snap, +1)
        if deltas:
            with self._counts.mutate() as counts:
                for job, delta in deltas.items():
                    merged = Counter(counts.get(job, {}))
                    merged.update(delta)
                    kept = {s: n for s, n in merged.items() if n}
                    if kept:
                        counts[job] = kept
                    else:
                        counts.pop(job, None)
                self._counts = counts.finish()

    @staticmethod
    def _count(deltas: dict[str, Counter[TaskState]], tid: str, snap: CellSnapshot,
               sign: int) -> None:
        rec = snap.tasks.get(tid)
        if rec is not None:
            delta = deltas.get(rec.job)
            if delta is None:
                delta = deltas[rec.job] = Counter()
            delta[task_view(snap, tid).state] += sign

    def _retag_task(self, tid: str, prev: CellSnapshot, snap: CellSnapshot) -> None:
        old, new = prev.tasks.get(tid), snap.tasks.get(tid)
        if old is not None and old.gang and (new is None or new.gang != old.gang):
            _discard(self._gang_tasks, old.gang, tid)
        if new is not None and new.gang:
            self._gang_tasks.setdefault(new.gang, set()).add(tid)

    def _machine_in(self, m: Machine, snap: CellSnapshot) -> None:
        self._machine_changed(None, snap, m, snap)

    def _machine_changed(self, old: Machine | None, prev: CellSnapshot, new: Machine | None,
                         snap: CellSnapshot) -> None:
        """Move the totals from machine record ``old`` (None: absent) at ``prev`` to
        ``new`` at ``snap`` (the same record when only a gang it names changed)."""
        was_up = old is not None and old.state is not MachineState.DOWN
        is_up = new is not None and new.state is not MachineState.DOWN
        self._up += is_up - was_up
        if old is not None:
            for g in old.gang_tags:
                _discard(self._gang_machines, g, old.id)
        if new is not None:
            for g in new.gang_tags:
                self._gang_machines.setdefault(g, set()).add(new.id)
        if old is not None and new is not None and was_up and is_up and not (
            old.has_tags or new.has_tags
        ):
            # The common case (a claim or a release): use moves by the allocations
            # added and removed, without summing every allocation of the machine again.
            if old.capacity != new.capacity:
                _add(self._capacity, old.capacity, -1)
                _add(self._capacity, new.capacity, +1)
            _add_diff(self._used, old.allocations, new.allocations)
            return
        if old is not None and was_up:
            _add(self._capacity, old.capacity, -1)
            _add(self._used, machine_used(old, prev.gangs), -1)
        if new is not None and is_up:
            _add(self._capacity, new.capacity, +1)
            _add(self._used, machine_used(new, snap.gangs), +1)

    def _machine_totals(self, machines: int) -> MachineTotals:
        return MachineTotals(self._up, machines - self._up, _resources(self._capacity),
                             _resources(self._used))


def _add(sums: dict[str, float], r: Resources, sign: int) -> None:
    for name, amount in r.amounts:
        sums[name] = sums.get(name, 0.0) + sign * amount


def _add_diff(sums: dict[str, float], old: Mapping[str, Allocation],
              new: Mapping[str, Allocation]) -> None:
    get = old.get
    for tid, a in new.items():
        b = get(tid)
        if b is a:  # kept as it was (most of a busy machine's allocations)
            continue
        if b is None:
            _add(sums, a.resources, +1)
        elif b.resources.amounts != a.resources.amounts:
            _add(sums, b.resources, -1)
            _add(sums, a.resources, +1)
    for tid, b in old.items():
        if tid not in new:
            _add(sums, b.resources, -1)


def _discard(index: dict[str, set[str]], key: str, member: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def _resources(sums: dict[str, float]) -> Resources:
    # Running sums of floats drift by a few ulps; what is left of a dimension once
    # everything is subtracted again is noise, not use.
    return Resources(tuple(sorted((n, a) for n, a in sums.items() if abs(a) > 1e-9)))
