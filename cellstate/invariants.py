"""The store's safety invariants, checked over a snapshot (tests, `omega check`)."""

from __future__ import annotations

from collections.abc import Iterable

from cellstate import codec
from cellstate.cell import CellReader, alloc_holds, alloc_placed, scheduler_usage, task_view
from cellstate.errors import ModelError
from cellstate.keys import KeyKind, Keyspace, split_alloc
from cellstate.kv.base import KeyValue
from cellstate.model import TaskState, UsageRecord, selector_matches_labels, sum_resources


def violations(cell: CellReader) -> list[str]:
    """Every broken invariant, as a sentence; empty when the cell is sound."""
    out: list[str] = []
    placed_on: dict[str, str] = {}
    for m in cell.machines.values():
        held = sum_resources(a.resources for a in m.allocations.values()
                             if alloc_holds(a, cell.gangs))
        dim = held.exceeding(m.capacity)
        if dim is not None:
            out.append(f"machine {m.id} over-committed in {dim}: {held.get(dim):g} > "
                       f"{m.capacity.get(dim):g}")
        for a in m.allocations.values():
            if not alloc_placed(a, cell.gangs):
                continue
            if a.task in placed_on:
                out.append(f"task {a.task} placed on both {placed_on[a.task]} and {m.id}")
            placed_on[a.task] = m.id
            if a.job not in cell.jobs:
                out.append(f"machine {m.id} runs task {a.task} of unknown job {a.job}")
    for tid in {*cell.tasks.keys(), *placed_on}:
        view = task_view(cell, tid)
        where = placed_on.get(tid)
        if view.state is TaskState.RUNNING and where != view.machine:
            out.append(f"task {tid} is running on {view.machine} but holds "
                       f"{where or 'no machine'}")
        if view.state is not TaskState.RUNNING and where is not None:
            out.append(f"task {tid} is {view.state.value} but still placed on {where}")
        job = cell.jobs.get(view.job)
        if job is not None and view.index >= job.task_count:
            out.append(f"task {tid} is beyond job {job.id}'s {job.task_count} tasks")
    for name, rec in cell.usage.items():
        if not isinstance(rec, UsageRecord):
            continue
        lim = cell.config.limits_for(name)
        if lim is None or lim.max_resources is None or rec.base_revision != cell.config.revision:
            continue
        actual = scheduler_usage(cell, name)
        if (actual - rec.used) or (rec.used - actual):
            out.append(f"usage counter of {name} says {rec.used}, machines say {actual}")
        dim = actual.exceeding_limit(lim.max_resources)
        # A limit set below what the scheduler held then is passed until its tasks end:
        # only claims past both the limit and that are a broken promise.
        if dim is not None and (rec.base_used is None
                                or actual.get(dim) > rec.base_used.get(dim)):
            out.append(f"scheduler {name} holds {actual.get(dim):g} {dim}, past its limit")
    return out


def layout_violations(keys: Keyspace, kvs: Iterable[KeyValue]) -> list[str]:
    """How a cell's stored keys (``kvs``, all of them at one revision) break the
    allocation layout of ``cellstate.keys``, which a snapshot cannot show (a reader
    keeps one allocation per task): a task with two allocation keys on a machine,
    allocation keys of a machine without a record, a machine whose record counts
    other than its keys, a key named after a sequence the machine had not reached
    when it was written."""
    out: list[str] = []
    machines: dict[str, KeyValue] = {}
    held: dict[str, dict[str, list[KeyValue]]] = {}
    for kv in kvs:
        kind = keys.classify(kv.key)
        if kind is None:
            continue
        if kind[0] is KeyKind.MACHINE:
            machines[kind[1]] = kv
        elif kind[0] is KeyKind.ALLOC:
            try:
                mid, seq, tid = split_alloc(kind[1])
            except ValueError as e:
                out.append(str(e))
                continue
            held.setdefault(mid, {}).setdefault(tid, []).append(kv)
            if kv.mod_revision <= seq:
                out.append(f"allocation key {kv.key.decode()!r} names sequence {seq} but "
                           f"was written at revision {kv.mod_revision}")
    for mid, tasks in sorted(held.items()):
        rec = machines.get(mid)
        if rec is None:
            out.append(f"machine {mid} has no record but {len(tasks)} allocation key(s)")
            continue
        for tid, kvs_of in sorted(tasks.items()):
            if len(kvs_of) > 1:
                out.append(f"task {tid} has {len(kvs_of)} allocation keys on {mid}")
    for mid, rec in sorted(machines.items()):
        try:
            count = codec.decode_machine_counted(mid, rec.value, rec.mod_revision)[1]
        except ModelError as e:
            out.append(str(e))
            continue
        stored = sum(len(v) for v in held.get(mid, {}).values())
        if count != stored:
            out.append(f"machine {mid}'s record counts {count} allocation(s), "
                       f"{stored} are stored")
    return out


def placed_tasks_of(cell: CellReader, job: str) -> int:
    """How many of ``job``'s tasks count as running."""
    return sum(
        1
        for m in cell.machines.values()
        for a in m.allocations.values()
        if a.job == job and alloc_placed(a, cell.gangs)
    )


def constraint_violations(cell: CellReader) -> list[str]:
    """Placement rules the running tasks break as they stand now: a machine selector,
    tasks per machine, anti-affinity (both ways) and affinity (each machine holding a
    task of a job with an affinity rule holds a task of a job it matches, the job's
    own included). Not an invariant of the store, which checks the rules when a task
    is placed: a task an affinity rule relied on may end later. An audit for placement
    experiments and tests, where tasks do not end."""
    out: list[str] = []
    for m in cell.machines.values():
        count: dict[str, int] = {}
        for a in m.allocations.values():
            if alloc_placed(a, cell.gangs):
                count[a.job] = count.get(a.job, 0) + 1
        jobs = [cell.jobs[j] for j in sorted(count) if j in cell.jobs]
        for job in jobs:
            c = job.constraints
            if c.machine_selector and not all(r.matches(m.label(r.key))
                                              for r in c.machine_selector):
                out.append(f"job {job.id} runs on {m.id}, which its selector does not match")
            if c.max_per_machine and count[job.id] > c.max_per_machine:
                out.append(f"job {job.id} runs {count[job.id]} tasks on {m.id} "
                           f"(max_per_machine {c.max_per_machine})")
            if c.affinity and not any(selector_matches_labels(c.affinity, o.labels)
                                      for o in jobs):
                out.append(f"job {job.id} runs on {m.id} with no task of a job its "
                           "affinity matches")
            if c.anti_affinity:
                for o in jobs:
                    if o.id != job.id and selector_matches_labels(c.anti_affinity, o.labels):
                        out.append(f"job {job.id} runs on {m.id} beside job {o.id}, which "
                                   "its anti-affinity matches")
    return out
