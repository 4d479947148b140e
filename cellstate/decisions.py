"""The judge: every write the cell accepts, decided by a pure function over a snapshot.

Each function here reads a :class:`~cellstate.cell.CellReader` (a replica's snapshot,
the store's working view, the simulator's cell) and returns a :class:`Change`: the
records the decision relied on and the records to write. It does no I/O. Backends only
apply changes:

* ``CellStore`` (etcd, memory) writes a change in one etcd transaction guarded by the
  revision of every record it read or writes, so a change decided on state that moved
  meanwhile is thrown away and decided again;
* ``SimCell`` applies it to its in-memory maps at the next revision.

Claims are decided by ``validation.validate`` (the heart of the contract); its
``Decision`` becomes a change with :func:`claims_change`. A refusal (a task that is not
running, a capacity below what a machine holds...) raises a ``StoreError`` that says
why; nothing is written then. A write that finds its effect in place already (a
retried request whose answer was lost) returns a change with nothing to write and the
revision that made it (:attr:`Change.done_at`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from cellstate.cell import CellReader, alloc_holds, alloc_placed, task_view
from cellstate.codec import MAX_TASKS_PER_JOB
from cellstate.errors import AlreadyExistsError, NotFoundError, StoreError
from cellstate.keys import KeyKind
from cellstate.model import (
    RELEASE_OUTCOMES,
    Allocation,
    GangState,
    Job,
    JobState,
    JobStatus,
    Machine,
    MachineState,
    Resources,
    TaskEvent,
    TaskRecord,
    TaskResult,
    TaskState,
    add_each,
    check_status_text,
    split_task_id,
    sum_resources,
    task_id,
    trusted_task_event,
    trusted_task_record,
    with_event,
)
from cellstate.validation import Decision

# Enum members as globals on hot paths (why: cellstate/validation.py).
_MACHINE = KeyKind.MACHINE
_TASK = KeyKind.TASK
_RUNNING = TaskState.RUNNING

Ref = tuple[KeyKind, str]  # a record: its kind and id
_NOTHING = Resources()


@attrs.frozen
class Change:
    """One write: what it relied on, what it writes, and how it moves the resources
    each scheduler holds (for per-scheduler limits)."""

    reads: frozenset[Ref]
    writes: Mapping[Ref, object]  # the new record, or None to delete it
    added: Mapping[str, Resources] = attrs.field(factory=dict)
    removed: Mapping[str, Resources] = attrs.field(factory=dict)
    done_at: int = 0  # set when the effect was in place already: nothing to write

    @property
    def guarded(self) -> frozenset[Ref]:
        """Every record the write must find as the decision saw it: what it read and
        what it overwrites."""
        return self.reads | frozenset(self.writes)


def merged(changes: Sequence[Change]) -> Change:
    """Changes decided one over another (each saw the ones before it) as one change:
    later records win, reads add up."""
    reads: set[Ref] = set()
    writes: dict[Ref, object] = {}
    added: dict[str, Resources] = {}
    removed: dict[str, Resources] = {}
    for c in changes:
        reads |= c.reads
        writes.update(c.writes)
        for into, more in ((added, c.added), (removed, c.removed)):
            for s, r in more.items():
                into[s] = into.get(s, Resources()) + r
    return Change(frozenset(reads), writes, added, removed)


def _machine_reads(m: Machine) -> set[Ref]:
    """A machine and the gangs whose staged records on it decide how they read."""
    refs: set[Ref] = {(KeyKind.MACHINE, m.id)}
    if m.has_tags:
        refs |= {(KeyKind.GANG, g) for g in m.gang_tags}
    return refs


# -- claims --------------------------------------------------------------------------


def claims_change(decision: Decision) -> Change:
    """The change a claims decision (``validation.validate``) makes."""
    r = decision.reads
    reads: set[Ref] = {(KeyKind.CONFIG, "")}
    reads.update((KeyKind.MACHINE, i) for i in r.machines)
    reads.update((KeyKind.TASK, i) for i in r.tasks)
    reads.update((KeyKind.JOB, i) for i in r.jobs)
    reads.update((KeyKind.GANG, i) for i in r.gangs)
    reads.update((KeyKind.USAGE, i) for i in r.usage)
    reads.update((KeyKind.STATUS, i) for i in r.statuses)
    writes: dict[Ref, object] = {(KeyKind.MACHINE, i): m for i, m in decision.machines.items()}
    writes.update(((KeyKind.TASK, i), t) for i, t in decision.tasks.items())
    return Change(frozenset(reads), writes, decision.added, decision.removed)


# -- tasks that end --------------------------------------------------------------------


def release_task(
    cell: CellReader, tid: str, outcome: TaskState, machine: str | None = None,
    result: TaskResult | None = None, *, at: float = 0.0, by: str = "", why: str = "",
) -> Change:
    """A running task ended (finished, failed, lost, killed): record it (with
    ``result``, how its run ended, and an event of ``at``, ``by`` and ``why`` in its
    history) and free its hold. With ``machine``, refused unless the task runs
    there (a late report from an agent must not end the task's next run elsewhere).
    The caller must have read the task, its machine and the gangs staged on it."""
    if outcome not in RELEASE_OUTCOMES:
        raise StoreError(f"task {tid}: outcome must be finished, failed, lost or killed, "
                         f"not {outcome!r}")
    split_task_id(tid)
    rec = cell.tasks.get(tid)
    view = task_view(cell, tid)
    if (rec is not None and view.state is outcome and rec.state is outcome
            and (machine is None or rec.machine == machine)):
        # Reported already (a retry of a release whose answer was lost, e.g. over an
        # etcd leader change): the same answer again.
        return Change(frozenset(), {}, done_at=rec.revision)
    if view.state is not TaskState.RUNNING:
        raise StoreError(f"task {tid} is {view.state.value}, not running")
    assert rec is not None
    if machine is not None and rec.machine != machine:
        raise StoreError(f"task {tid} runs on {rec.machine}, not {machine}")
    m = cell.machines.get(rec.machine)
    a = m.allocations.get(tid) if m is not None else None
    if m is None or a is None:
        raise StoreError(f"task {tid} is not on machine {rec.machine} any more")
    reads = _machine_reads(m) | {(KeyKind.CONFIG, ""), (KeyKind.TASK, tid)}
    if rec.gang:
        reads.add((KeyKind.GANG, rec.gang))
    return Change(
        frozenset(reads),
        {(KeyKind.TASK, tid): TaskRecord(
            rec.job, rec.index, outcome, m.id, a.scheduler,
            **(attrs.asdict(result) if result is not None else {}),
            placed_at=rec.placed_at,
            history=with_event(rec, TaskEvent(at, outcome, m.id, by or m.agent, why))),
         (KeyKind.MACHINE, m.id): _without(m, [tid])},
        removed={a.scheduler: a.resources},
    )


def end_tasks(
    cell: CellReader, tids: Iterable[str], outcome: TaskState, placed_at: int | None = None,
    reads: bool = True, at: float = 0.0,
) -> tuple[Change, list[str]]:
    """Many tasks ended at once (the simulator's task ends of one instant): those still
    running are released in one change, the rest skipped (preempted or lost meanwhile;
    with ``placed_at``, also those placed again since that revision, whose own end
    event frees them). Returns the change and the tasks it releases. ``reads=False``
    leaves the change's reads empty, for a caller that applies it to the very state
    it was decided on (the simulator) and so has no guards to build."""
    e = ended_tasks(cell, tids, outcome, placed_at, at)
    records: dict[Ref, object] = {(_TASK, i): t for i, t in e.tasks.items()}
    records.update(((_MACHINE, i), m) for i, m in e.machines.items())
    refs: set[Ref] = set()
    if reads:
        for mid in e.machines:
            refs |= _machine_reads(cell.machines[mid])
    return Change(frozenset(refs), records, removed=e.removed), list(e.tasks)


@attrs.frozen
class Ended:
    """What :func:`ended_tasks` decided: the new records of the tasks released (in the
    order named) and of their machines, and what each scheduler no longer holds."""

    tasks: dict[str, TaskRecord]
    machines: dict[str, Machine]
    removed: dict[str, Resources]


def ended_tasks(cell: CellReader, tids: Iterable[str], outcome: TaskState,
                placed_at: int | None = None, at: float = 0.0) -> Ended:
    """The decision of :func:`end_tasks` as records by id, without the change built
    around it: a writer that applies them to the very state they were decided on (the
    simulator, for every job's end) needs no guards and no (kind, id) keys."""
    by_machine: dict[str, list[str]] = {}
    out: dict[str, TaskRecord] = {}
    freed: dict[str, list[Resources]] = {}  # per scheduler, summed at the end
    tasks, machines = cell.tasks, cell.machines
    for tid in tids:
        rec = tasks.get(tid)
        if rec is None or rec.state is not _RUNNING:
            continue
        if placed_at is not None and rec.revision != placed_at:
            continue
        if tid in out:
            continue  # named twice: it ends once
        mid = rec.machine
        a = machines[mid].allocations[tid]
        gone = by_machine.get(mid)
        if gone is None:
            by_machine[mid] = [tid]
        else:
            gone.append(tid)
        out[tid] = trusted_task_record(
            rec.job, rec.index, outcome, mid, rec.scheduler, "", rec.placed_at,
            with_event(rec, trusted_task_event(at, outcome, mid)))
        held = freed.get(a.scheduler)
        if held is None:
            freed[a.scheduler] = [a.resources]
        else:
            held.append(a.resources)
    return Ended(out, {mid: _without(machines[mid], gone) for mid, gone in by_machine.items()},
                 {s: add_each(_NOTHING, held) for s, held in freed.items()})


def _without(m: Machine, gone: Sequence[str]) -> Machine:
    """``m`` without the allocations of ``gone``, built once with its settled usage
    (machines are rebuilt for every task that ends: the simulator's hot path)."""
    # A copy less a few entries: a tenth of the time of filtering every entry.
    allocs = dict(m.allocations)
    held = [allocs.pop(t).resources for t in gone]
    # Fewer allocations keep a calm machine calm.
    if m.has_tags:
        return m.with_allocations(allocs, calm=m.calm)
    freed = held[0] if len(held) == 1 else sum_resources(held)
    return m.with_allocations(allocs, m.settled_used - freed, False, calm=m.calm)


# -- machines ------------------------------------------------------------------------


def add_machines(cell: CellReader, machines: Sequence[Machine]) -> Change:
    """New machines (none may exist already, nor carry allocations)."""
    for m in machines:
        if m.allocations:
            raise StoreError(f"machine {m.id!r}: a new machine cannot carry allocations")
    ids = [m.id for m in machines]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise StoreError(f"machines listed twice: {', '.join(dupes)}")
    present = [i for i in ids if i in cell.machines]
    if present:
        raise AlreadyExistsError(f"machines already exist: {', '.join(present)}")
    return Change(frozenset(), {(KeyKind.MACHINE, m.id): attrs.evolve(m, seq=0)
                                for m in machines})


def replace_machine(cell: CellReader, old: Machine, changed: Machine) -> Change:
    """Machine ``old`` becomes ``changed`` (same allocations, other capacity, labels,
    state...): refused if the new capacity is below what its tasks hold."""
    held = sum_resources(
        a.resources for a in old.allocations.values() if alloc_holds(a, cell.gangs)
    )
    dim = held.exceeding(changed.capacity)
    if dim is not None:
        raise StoreError(
            f"machine {old.id}: new capacity {changed.capacity.get(dim):g} {dim} "
            f"is below the {held.get(dim):g} its tasks hold"
        )
    return Change(frozenset(_machine_reads(old)), {(KeyKind.MACHINE, old.id): changed})


def take_down(cell: CellReader, old: Machine, down: Machine, budget: int | None = None,
              at: float = 0.0, why: str = "") -> Change:
    """Machine ``old`` goes down as ``down`` (its state changed): every task holding it
    is lost, and gangs still preparing holds on it are aborted (they could not run
    here). ``budget`` caps the allocations dropped in one change; a machine holding
    more stays down with the rest, which the next change drops."""
    writes: dict[Ref, object] = {}
    removed: dict[str, Resources] = {}
    allocs = dict(old.allocations)
    for n, (tid, a) in enumerate(old.allocations.items()):
        if budget is not None and n >= budget:
            break
        del allocs[tid]
        g = cell.gangs.get(a.gang) if a.gang else None
        if a.gang and g is not None and g.state is GangState.PREPARING:
            writes[(KeyKind.GANG, a.gang)] = None  # abort it; its task records are void
            continue
        if not alloc_placed(a, cell.gangs):
            continue
        job, index = split_task_id(tid)
        rec = cell.tasks.get(tid)
        writes[(KeyKind.TASK, tid)] = TaskRecord(
            job, index, TaskState.LOST, old.id, a.scheduler,
            placed_at=rec.placed_at if rec is not None else 0.0,
            history=with_event(rec, TaskEvent(at, TaskState.LOST, old.id, "",
                                              why or f"machine {old.id} {down.state.value}")))
        removed[a.scheduler] = removed.get(a.scheduler, Resources()) + a.resources
    writes[(KeyKind.MACHINE, old.id)] = down.with_allocations(allocs)
    return Change(frozenset(_machine_reads(old) | {(KeyKind.CONFIG, "")}), writes,
                  removed=removed)


def update_machine(
    cell: CellReader, machine_id: str, *, capacity: Resources | None = None,
    state: MachineState | None = None, labels: tuple[tuple[str, str], ...] | None = None,
    budget: int | None = None, at: float = 0.0,
) -> Change:
    """Change a machine's capacity, state or labels; taking it down loses its tasks."""
    m = cell.machines.get(machine_id)
    if m is None:
        raise NotFoundError(f"unknown machine {machine_id!r}")
    changed = attrs.evolve(
        m,
        capacity=capacity if capacity is not None else m.capacity,
        state=state if state is not None else m.state,
        labels=labels if labels is not None else m.labels,
    )
    if state is MachineState.DOWN:
        return take_down(cell, m, changed, budget, at)
    return replace_machine(cell, m, changed)


MACHINE_ACTIONS = ("cordon", "uncordon", "drain")


def machine_action(cell: CellReader, machine_id: str, action: str,
                   budget: int | None = None, at: float = 0.0, by: str = "") -> Change:
    """An operator's change to a machine that is up or draining: ``cordon`` (draining:
    it runs what it has and takes nothing new), ``uncordon`` (up again) or ``drain``
    (draining, and every task on it lost, so that its scheduler places it elsewhere;
    ``budget`` as for :func:`take_down`). A machine that is down is refused: it comes
    back when its agent registers it. Nothing to write when the machine is in that
    state already (a drained machine holding no task)."""
    if action not in MACHINE_ACTIONS:
        raise StoreError(f"machine {machine_id}: {action!r} is not one of "
                         f"{', '.join(MACHINE_ACTIONS)}")
    m = cell.machines.get(machine_id)
    if m is None:
        raise NotFoundError(f"unknown machine {machine_id!r}")
    if m.state is MachineState.DOWN:
        raise StoreError(f"cannot {action} machine {machine_id}: it is down (it comes back "
                         "up when its agent registers it)")
    nothing = Change(frozenset(), {})
    if action == "uncordon":
        up = attrs.evolve(m, state=MachineState.UP)
        return nothing if m.state is MachineState.UP else replace_machine(cell, m, up)
    if action == "cordon":
        cordoned = attrs.evolve(m, state=MachineState.CORDONED)
        return nothing if m.state is not MachineState.UP else replace_machine(cell, m,
                                                                              cordoned)
    draining = attrs.evolve(m, state=MachineState.DRAINING)
    if m.state is MachineState.DRAINING and not m.allocations:
        return nothing
    return take_down(cell, m, draining, budget, at, f"machine {m.id} drained"
                     + (f" by {by}" if by else ""))


def remove_machine(cell: CellReader, machine_id: str) -> Change:
    """Delete a machine that is down and holds nothing (take it down first)."""
    m = cell.machines.get(machine_id)
    if m is None:
        raise NotFoundError(f"unknown machine {machine_id!r}")
    if m.state is not MachineState.DOWN or m.allocations:
        raise StoreError(f"machine {machine_id} is {m.state.value} with {len(m.allocations)} "
                         "task(s): take it down first")
    return Change(frozenset(), {(KeyKind.MACHINE, machine_id): None})


# -- jobs ------------------------------------------------------------------------------


def submit_job(cell: CellReader, job: Job) -> Change:
    """A new job (its tasks start pending)."""
    if job.id in cell.jobs:
        raise AlreadyExistsError(f"job {job.id!r} already exists")
    return Change(frozenset(), {(KeyKind.JOB, job.id): job})


def set_job_status(cell: CellReader, status: JobStatus) -> Change:
    """A verdict on a job (abandoned with a reason, or killed). A kill is final."""
    if not status.reason:
        raise StoreError(f"job {status.job}: a status needs a reason")
    check_status_text(status)
    if status.job not in cell.jobs:
        raise NotFoundError(f"unknown job {status.job!r}")
    old = cell.statuses.get(status.job)
    if old is not None and old.state is JobState.KILLED:
        return Change(frozenset(), {}, done_at=old.revision)
    return Change(frozenset({(KeyKind.JOB, status.job)}), {(KeyKind.STATUS, status.job): status})


def resize_job(cell: CellReader, job_id: str, task_count: int, placed: Iterable[int],
               drop_ended: bool = False) -> Change:
    """Grow a job, or shrink it to no fewer tasks than any that was ever placed
    (``placed``: the indices of the job's task records). With ``drop_ended`` (a user's
    scale-down, after the tasks beyond the new count were stopped) a job that is not a
    gang may shrink below tasks that have run, as long as none of them runs now: their
    records go with the count. The caller must also make sure no task of the job was
    placed since it read ``placed`` (the store guards the job's whole task range)."""
    if isinstance(task_count, bool) or not isinstance(task_count, int) or not (
        1 <= task_count <= MAX_TASKS_PER_JOB
    ):
        raise StoreError(f"job {job_id}: task count must be between 1 and "
                         f"{MAX_TASKS_PER_JOB}, got {task_count!r}")
    job = cell.jobs.get(job_id)
    if job is None:
        raise NotFoundError(f"unknown job {job_id!r}")
    mr = job.mapreduce
    if mr is not None and not mr.workers <= task_count <= mr.max_workers:
        raise StoreError(f"job {job_id}: a MapReduce job runs from the {mr.workers} workers it "
                         f"asked for to its elastic upper bound of {mr.max_workers}, not "
                         f"{task_count}")
    writes: dict[Ref, object] = {}
    if task_count < job.task_count:
        beyond = sorted(i for i in placed if i >= task_count)
        if beyond and (not drop_ended or job.gang):
            raise StoreError(f"job {job_id}: task {beyond[-1]} has run; cannot shrink to "
                             f"{task_count} tasks")
        for i in beyond:
            tid = task_id(job_id, i)
            if task_view(cell, tid).state is TaskState.RUNNING:
                raise StoreError(f"job {job_id}: task {tid} runs; stop it before shrinking "
                                 f"to {task_count} tasks")
            writes[(KeyKind.TASK, tid)] = None
    # Input of tasks a shrink removes goes with them (a record names no task it lacks).
    writes[(KeyKind.JOB, job_id)] = attrs.evolve(
        job, task_count=task_count, task_input=job.task_input[:task_count])
    return Change(frozenset(), writes)


# -- large gangs ---------------------------------------------------------------------


def settle_gang_machines(cell: CellReader, gid: str, machine_ids: Iterable[str],
                         committed: bool, limit: int | None = None, at: float = 0.0
                         ) -> Change:
    """Rewrite the machines where gang ``gid`` staged records: its holds become plain
    allocations and its marked victims are preempted if it committed; both are dropped
    if it aborted. ``limit``: settle at most this many of each machine's records (a
    machine holding more of the gang's records than one etcd transaction can write is
    settled over several; each record counts as held whichever side of the settling it
    is on, so a machine settled in part is still a consistent cell)."""
    writes: dict[Ref, object] = {}
    reads: set[Ref] = {(KeyKind.GANG, gid)}
    for mid in machine_ids:
        m = cell.machines.get(mid)
        if m is None:
            continue
        allocs: dict[str, Allocation] = dict(m.allocations)
        left = limit
        for tid, a in m.allocations.items():
            if a.gang != gid and a.evicted_by != gid:
                continue
            if left is not None:
                if left <= 0:
                    break
                left -= 1
            if a.gang == gid:
                if committed:
                    allocs[tid] = attrs.evolve(a, gang="")
                else:
                    del allocs[tid]
            elif a.evicted_by == gid:
                if committed:
                    del allocs[tid]
                    rec = cell.tasks.get(tid)
                    writes[(KeyKind.TASK, tid)] = TaskRecord(
                        *split_task_id(tid), TaskState.PREEMPTED, mid, a.scheduler,
                        placed_at=rec.placed_at if rec is not None else 0.0,
                        history=with_event(rec, TaskEvent(
                            at, TaskState.PREEMPTED, mid, "", f"preempted for gang {gid}")))
                else:
                    allocs[tid] = attrs.evolve(a, evicted_by="")
        reads.add((KeyKind.MACHINE, mid))
        writes[(KeyKind.MACHINE, mid)] = m.with_allocations(allocs)
    return Change(frozenset(reads), writes)


def settle_gang_tasks(cell: CellReader, gid: str, task_ids: Iterable[str],
                      committed: bool) -> Change:
    """Clear gang ``gid``'s tag from the task records it staged (keep them if it
    committed, delete them if it aborted)."""
    writes: dict[Ref, object] = {}
    for tid in task_ids:
        t = cell.tasks.get(tid)
        if t is None or t.gang != gid:
            continue
        writes[(KeyKind.TASK, tid)] = attrs.evolve(t, gang="") if committed else None
    return Change(frozenset({(KeyKind.GANG, gid)}), writes)
